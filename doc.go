// Package ferry embeds the Ferry durable workflow engine in a Go program:
// Open a database (an SQLite file by default, or Postgres), serve the REST
// API from Handler, and call Run to execute workflow runs. The ferry command
// is a thin wrapper around this package.
//
// This package wires the internal packages together; it holds no logic of
// its own beyond configuration and start-up.
package ferry
