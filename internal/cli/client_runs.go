package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/client"
)

func triggerCmd(o *clientOpts) *cobra.Command {
	var (
		data, idemKey string
		wait          bool
		timeout       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "trigger NAME|ID",
		Short: "Start a run of a workflow",
		Long: `Start a run and print "run <id> <status>".

The trigger payload is JSON given with -d, literally or as @FILE (@- for
standard input). With --wait the command polls until the run finishes and
then shows it as "ferry run" does (with -o json, only the finished run is
printed).`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			input, err := triggerInput(cmd, data)
			if err != nil {
				return err
			}
			res, created, err := c.Trigger(cmd.Context(), args[0], input, idemKey)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !created {
				fmt.Fprintf(cmd.ErrOrStderr(), "idempotency key %q matched an existing run; no new run was started\n", idemKey)
			}
			if !wait {
				if o.json() {
					return printJSON(out, res.Raw)
				}
				fmt.Fprintf(out, "run %s %s\n", res.RunID, res.Status)
				return nil
			}
			if !o.json() {
				fmt.Fprintf(out, "run %s %s\n", res.RunID, res.Status)
			}
			run, err := waitForRun(cmd.Context(), c, res.RunID, timeout)
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(out, run.Raw)
			}
			fmt.Fprintln(out)
			return printRun(out, run)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&data, "data", "d", "", "trigger payload: JSON, or @FILE to read it from a file (@- for standard input)")
	f.StringVar(&idemKey, "idempotency-key", "", "repeat-safe key: a trigger with a key already used returns the first run")
	f.BoolVar(&wait, "wait", false, "wait for the run to finish and show it")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "with --wait, how long to wait before giving up")
	return cmd
}

// triggerInput reads -d: literal JSON, @FILE or @- for standard input.
func triggerInput(cmd *cobra.Command, data string) (json.RawMessage, error) {
	if data == "" {
		return nil, nil
	}
	b, src := []byte(data), "--data"
	if file, ok := strings.CutPrefix(data, "@"); ok {
		var err error
		if b, err = readInput(cmd, file); err != nil {
			return nil, err
		}
		src = inputName(file)
	}
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		return nil, fmt.Errorf("%s is not valid JSON: %v", src, err)
	}
	return b, nil
}

func runsCmd(o *clientOpts) *cobra.Command {
	var (
		limit  int
		cursor string
	)
	cmd := &cobra.Command{
		Use:   "runs NAME|ID",
		Short: "List a workflow's runs, newest first",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("limit") && limit < 1 { // above 500 the server says so
				return fmt.Errorf("--limit must be from 1 to 500")
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			runs, next, err := c.ListRuns(cmd.Context(), args[0], cursor, limit)
			if err != nil {
				return err
			}
			if next != "" {
				more := "ferry runs " + args[0]
				if limit > 0 {
					more += " --limit " + strconv.Itoa(limit)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "more runs: %s --cursor %s\n", more, next)
			}
			if o.json() {
				raws := make([]json.RawMessage, len(runs))
				for i, r := range runs {
					raws[i] = r.Raw
				}
				return printJSONList(cmd.OutOrStdout(), raws)
			}
			tw := newTable(cmd.OutOrStdout(), "RUN ID", "STATUS", "STARTED", "FINISHED", "DURATION")
			for _, r := range runs {
				tw.row(r.ID, r.Status, fmtTime(&r.StartedAt), fmtTime(r.FinishedAt), runDuration(&r))
			}
			return tw.flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "at most N runs (1-500; default the server's page size)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue a listing from this cursor")
	return cmd
}

func runCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "run RUN_ID",
		Short: "Show a run and the state of each step",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			run, err := c.GetRun(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), run.Raw)
			}
			return printRun(cmd.OutOrStdout(), run)
		},
	}
}

// printRun shows a run's header and one row per step in definition order.
func printRun(out io.Writer, run *client.Run) error {
	kv := newTable(out)
	kv.row("run", run.ID)
	kv.row("workflow", run.Workflow+" ("+run.WorkflowID+")")
	kv.row("version", strconv.Itoa(run.Version))
	kv.row("status", run.Status)
	kv.row("started", fmtTime(&run.StartedAt))
	kv.row("finished", fmtTime(run.FinishedAt))
	kv.row("duration", runDuration(run))
	if run.Error != "" {
		kv.row("error", run.Error)
	}
	if err := kv.flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw := newTable(out, "STEP", "TYPE", "STATUS", "CODE", "DURATION", "ATTEMPT", "ERROR")
	var callbacks []client.TaskResult
	for _, t := range run.Tasks {
		code := ""
		if t.StatusCode != nil {
			code = strconv.Itoa(*t.StatusCode)
		}
		dur := ""
		if t.DurationMS != nil {
			dur = fmtDuration(time.Duration(*t.DurationMS) * time.Millisecond)
		}
		attempt := ""
		if t.Attempt > 0 {
			attempt = strconv.Itoa(t.Attempt)
		}
		tw.row(t.Name, t.Type, t.Status, code, dur, attempt, truncate(t.Error, 80))
		if t.CallbackURL != "" && t.Status == client.StepWaiting {
			callbacks = append(callbacks, t)
		}
	}
	if err := tw.flush(); err != nil {
		return err
	}
	if len(callbacks) > 0 {
		fmt.Fprintln(out)
		for _, t := range callbacks {
			fmt.Fprintf(out, "%s is waiting for a POST to %s\n", t.Name, t.CallbackURL)
		}
	}
	return nil
}

func cancelCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel RUN_ID",
		Short: "Cancel a run that has not finished",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			run, err := c.CancelRun(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), run.Raw)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "run %s %s\n", run.ID, run.Status)
			return nil
		},
	}
}

func eventsCmd(o *clientOpts) *cobra.Command {
	var after int64
	cmd := &cobra.Command{
		Use:   "events RUN_ID",
		Short: "Show a run's event log",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			if after < 0 {
				return fmt.Errorf("--after must not be negative")
			}
			evs, err := c.Events(cmd.Context(), args[0], after)
			if err != nil {
				return err
			}
			if o.json() {
				b, err := json.Marshal(evs)
				if err != nil {
					return err
				}
				return printJSON(cmd.OutOrStdout(), b)
			}
			tw := newTable(cmd.OutOrStdout(), "SEQ", "TIME", "TYPE", "STEP", "DATA")
			for _, ev := range evs {
				data := ""
				if len(ev.Data) > 0 && string(ev.Data) != "null" {
					data = truncate(string(ev.Data), 100)
				}
				tw.row(strconv.FormatInt(ev.Seq, 10), fmtTime(&ev.At), ev.Type, ev.Step, data)
			}
			return tw.flush()
		},
	}
	cmd.Flags().Int64Var(&after, "after", 0, "only events with a sequence number above N")
	return cmd
}
