package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/client"
)

// defaultServer is where client commands go without --server/FERRY_SERVER.
const defaultServer = "http://127.0.0.1:8080"

// clientOpts holds the root's persistent flags used by client commands.
type clientOpts struct {
	server string
	apiKey string
	output string
}

// addClientCommands registers the commands that talk to a server.
func addClientCommands(root *cobra.Command) {
	o := &clientOpts{}
	pf := root.PersistentFlags()
	pf.StringVar(&o.server, "server", envOr("FERRY_SERVER", defaultServer), "base URL of the Ferry server for client commands (FERRY_SERVER)")
	// The key's default is read at run time so that help never shows it.
	pf.StringVar(&o.apiKey, "api-key", "", "API key for client commands (default $FERRY_API_KEY)")
	pf.StringVarP(&o.output, "output", "o", "table", "client command output: table, or json for the API's data as JSON")
	root.AddGroup(&cobra.Group{ID: groupWorkflows, Title: "Workflow commands:"}, &cobra.Group{ID: groupRuns, Title: "Run commands:"})
	for _, c := range []*cobra.Command{applyCmd(o), workflowsCmd(o), workflowCmd(o), deleteCmd(o)} {
		c.GroupID = groupWorkflows
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{triggerCmd(o), runsCmd(o), runCmd(o), cancelCmd(o), eventsCmd(o)} {
		c.GroupID = groupRuns
		root.AddCommand(c)
	}
	// The flags are inherited by every command; on the others (server,
	// migrate) they would be silently ignored, so refuse them there.
	prev := root.PersistentPreRunE
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if cmd.GroupID != groupWorkflows && cmd.GroupID != groupRuns {
			for _, name := range []string{"server", "api-key", "output"} {
				if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
					return fmt.Errorf("--%s only applies to client commands such as apply, trigger and run", name)
				}
			}
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}

// Command groups of the client commands.
const (
	groupWorkflows = "workflows"
	groupRuns      = "runs"
)

// client validates the flags and returns a client for the server.
func (o *clientOpts) client() (*client.Client, error) {
	if err := o.checkOutput(); err != nil {
		return nil, err
	}
	u, err := url.Parse(o.server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--server %q must be an http:// or https:// URL", o.server)
	}
	key := strings.TrimSpace(o.apiKey) // as the server registers FERRY_API_KEY
	if key == "" {
		key = strings.TrimSpace(os.Getenv("FERRY_API_KEY"))
	}
	if key == "" {
		return nil, errors.New("no API key: pass --api-key or set FERRY_API_KEY")
	}
	return client.New(o.server, key, client.WithHTTPClient(&http.Client{Timeout: 2 * time.Minute}), client.WithUserAgent("ferry-cli")), nil
}

func (o *clientOpts) checkOutput() error {
	switch o.output {
	case "table", "json":
		return nil
	}
	return fmt.Errorf("--output %q: use table or json", o.output)
}

func (o *clientOpts) json() bool { return o.output == "json" }

// exactArgs is cobra.ExactArgs with the command's usage in the message.
// An empty argument (an unset shell variable) is refused too: it left an
// empty segment in the request's path, which the server's path cleaning
// turned into another request (ferry runs "" asked for the runs of a
// workflow named "runs").
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("usage: %s", cmd.UseLine())
		}
		for _, a := range args {
			if strings.TrimSpace(a) == "" {
				return fmt.Errorf("an empty argument: usage: %s", cmd.UseLine())
			}
		}
		return nil
	}
}

// waitForRun polls a run until it is terminal or timeout passes, backing off
// from 100ms to 1s between polls.
func waitForRun(ctx context.Context, c *client.Client, id string, timeout time.Duration) (*client.Run, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 100 * time.Millisecond
	var last *client.Run
	for {
		run, err := c.GetRun(ctx, id)
		switch {
		case err == nil:
			if run.Terminal() {
				return run, nil
			}
			last = run
		case ctx.Err() == nil:
			return nil, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				st := "not finished"
				if last != nil {
					st = "still " + last.Status
				}
				return nil, fmt.Errorf("run %s is %s after %s (see: ferry run %s)", id, st, timeout, id)
			}
			return nil, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}
