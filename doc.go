// Package ferry embeds the Ferry durable workflow engine in a Go program:
// Open a database (an SQLite file by default, or Postgres), serve the REST
// API from Handler, and call Run to execute workflow runs. The ferry command
// is a thin wrapper around this package.
//
// The Engine's methods refuse what the HTTP API refuses with the
// *client.APIError it would answer (an unknown workflow is code not_found,
// an invalid definition invalid_workflow with a detail per problem, a stale
// lease token matches client.ErrLeaseLost): test them with client.HasCode
// and errors.Is, as over HTTP. Once Close has been called, Run and every
// method that reads or writes return ErrClosed.
//
// This package wires the internal packages together; it holds no logic of
// its own beyond configuration and start-up.
package ferry
