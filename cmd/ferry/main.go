// Command ferry is the Ferry server, CLI and (later) dashboard in one binary.
package main

import (
	"context"
	"os"

	"github.com/ferryhq/ferry/internal/cli"
)

func main() {
	os.Exit(cli.Execute(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
