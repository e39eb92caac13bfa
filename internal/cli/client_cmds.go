package cli

import "github.com/spf13/cobra"

// addClientCommands registers the commands that talk to a server.
func addClientCommands(root *cobra.Command) {}
