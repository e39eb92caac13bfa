// Package client is a Go client for Ferry's REST API. Besides the standard
// library it imports only internal/status, so its status names cannot drift
// from the server's.
//
// A Client talks to one server with one API key:
//
//	c := client.New("http://127.0.0.1:8080", os.Getenv("FERRY_API_KEY"))
//	wf, created, err := c.ApplyWorkflow(ctx, "order-processing", def)
//	res, _, err := c.Trigger(ctx, "order-processing", json.RawMessage(`{"order_id": 42}`), "")
//	run, err := c.GetRun(ctx, res.RunID)
//
// Requests go through a transport (NewTransport) that keeps up to
// MaxIdleConnsPerHost idle connections to the server, one for each request
// a worker has in flight; WithHTTPClient replaces it.
//
// Every failed request the server answered is an *APIError carrying the
// HTTP status, the error code and, for invalid definitions, one detail per
// problem located by a JSON path; use errors.As to inspect it.
package client
