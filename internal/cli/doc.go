// Package cli implements the ferry command: the server, migrations, and the
// client commands that talk to a server's REST API. Each command is a thin
// layer over package ferry (server side) or package client (client side).
//
// It must not import storage backends or the runtime directly; it goes
// through package ferry and package client.
package cli
