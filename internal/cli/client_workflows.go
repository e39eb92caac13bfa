package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/goccy/go-yaml"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/client"
)

func applyCmd(o *clientOpts) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or update a workflow from a JSON or YAML definition",
		Long: `Create the workflow a definition names, or update it when it exists.

The version only increases when the definition's content changed; applying
the same file again reports "unchanged". Use -f - to read standard input.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			doc, err := readInput(cmd, file)
			if err != nil {
				return err
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				return fmt.Errorf("%s is empty", inputName(file))
			}
			ctx := cmd.Context()
			// The name lets apply update an existing workflow and tell an
			// update from a no-op; when it cannot be read, the create below
			// makes the server explain what is wrong with the document.
			name := definitionName(doc)
			prev := 0
			if name != "" {
				cur, err := c.GetWorkflow(ctx, name)
				switch {
				case err == nil:
					prev = cur.Version
				case !client.HasCode(err, client.CodeNotFound):
					return err
				}
			}
			wf, created, err := c.ApplyWorkflow(ctx, name, doc)
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), wf.Raw)
			}
			verb := "created"
			switch {
			case created:
			case wf.Version > prev:
				verb = "updated"
			default:
				verb = "unchanged"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "workflow %s %s (version %d)\n", wf.Name, verb, wf.Version)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "definition file, JSON or YAML (- for standard input)")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}

// definitionName reads the top-level name of a JSON or YAML definition, or
// returns "".
func definitionName(doc []byte) string {
	doc = bytes.TrimPrefix(doc, []byte("\ufeff")) // a byte-order mark, as the server drops it
	var m map[string]any
	// JSON first; YAML also covers flow-style documents like {name: a}.
	if json.Unmarshal(doc, &m) != nil {
		m = nil
		if yaml.Unmarshal(doc, &m) != nil {
			return ""
		}
	}
	name, _ := m["name"].(string)
	return name
}

// readInput reads a file, or standard input for "-".
func readInput(cmd *cobra.Command, file string) ([]byte, error) {
	if file == "-" {
		b, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return nil, fmt.Errorf("read standard input: %w", err)
		}
		return b, nil
	}
	return os.ReadFile(file)
}

func inputName(file string) string {
	if file == "-" {
		return "standard input"
	}
	return file
}

func workflowsCmd(o *clientOpts) *cobra.Command {
	var (
		limit  int
		cursor string
	)
	cmd := &cobra.Command{
		Use:     "workflows",
		Aliases: []string{"ls"},
		Short:   "List workflows",
		Long: `List workflows by name. Without --limit or --cursor every page is
fetched; with them one page is shown and the next cursor is printed to
standard error.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("limit") && limit < 1 { // above 500 the server says so
				return fmt.Errorf("--limit must be from 1 to 500")
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			all := limit == 0 && cursor == ""
			var wfs []client.Workflow
			for {
				page, next, err := c.ListWorkflows(cmd.Context(), cursor, limit)
				if err != nil {
					return err
				}
				wfs = append(wfs, page...)
				cursor = next
				if !all || next == "" {
					break
				}
			}
			if cursor != "" {
				more := "more workflows: ferry workflows"
				if limit > 0 {
					more += " --limit " + strconv.Itoa(limit)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s --cursor %s\n", more, cursor)
			}
			if o.json() {
				raws := make([]json.RawMessage, len(wfs))
				for i, w := range wfs {
					raws[i] = w.Raw
				}
				return printJSONList(cmd.OutOrStdout(), raws)
			}
			tw := newTable(cmd.OutOrStdout(), "NAME", "VERSION", "TASKS", "ENABLED", "UPDATED")
			for _, w := range wfs {
				tw.row(w.Name, strconv.Itoa(w.Version), strconv.Itoa(w.TaskCount), strconv.FormatBool(w.Enabled), fmtTime(&w.UpdatedAt))
			}
			return tw.flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "show one page of at most N workflows (1-500)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue a listing from this cursor")
	return cmd
}

func workflowCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "workflow NAME|ID",
		Short: "Show a workflow and its definition",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			wf, err := c.GetWorkflow(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if o.json() {
				return printJSON(out, wf.Raw)
			}
			kv := newTable(out)
			kv.row("name", wf.Name)
			kv.row("id", wf.ID)
			if wf.Description != "" {
				kv.row("description", wf.Description)
			}
			kv.row("version", strconv.Itoa(wf.Version))
			kv.row("enabled", strconv.FormatBool(wf.Enabled))
			kv.row("trigger", wf.Trigger)
			kv.row("max duration", wf.MaxDuration)
			kv.row("fingerprint", wf.Fingerprint)
			kv.row("created", fmtTime(&wf.InsertedAt))
			kv.row("updated", fmtTime(&wf.UpdatedAt))
			if err := kv.flush(); err != nil {
				return err
			}
			fmt.Fprintln(out, "tasks:")
			return printJSON(out, wf.Tasks)
		},
	}
}

func deleteCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME|ID",
		Short: "Delete a workflow (its runs finish on their pinned version)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			if err := c.DeleteWorkflow(cmd.Context(), args[0]); err != nil {
				return err
			}
			if o.json() {
				return nil // the API answers 204: no data, so no output (the exit code says it)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "workflow %s deleted\n", args[0])
			return nil
		},
	}
}
