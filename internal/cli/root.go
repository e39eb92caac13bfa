package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Execute runs the ferry command line and returns the process exit code.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	tuneGC()
	root := NewRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "error:", err)
		return 1
	}
	return 0
}

// NewRoot builds the command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "ferry",
		Short:         "Ferry is a durable workflow engine",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serverCmd(), migrateCmd(), benchCmd())
	addClientCommands(root)
	return root
}

// envOr returns the environment variable's value or def.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// gcPercent is Go's GC target unless GOGC is set. Ferry's live heap is
// small (tens of MB) and its garbage is short-lived rows and statements:
// at Go's default of 100 the collector took a fifth of the CPU under load;
// at 400 it takes a fraction, for a heap up to five times the live one.
const gcPercent = 400

func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
