package sqlstore

import (
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// finishedIn lists the steps and runs a write ended, found by the terminal
// events it appended: an event is appended once, by the write that made
// the change, so a step or run rewritten later (its row carries it) is
// not told again.
func finishedIn(cs *changeset) []store.Finished {
	var out []store.Finished
	var runs map[string]int     // index of cs.runs, then len(cs.runs)+index of cs.created
	var told map[[2]string]bool // steps in out, once a cancelled run needs it
	add := func(f store.Finished) {
		out = append(out, f)
		if told != nil {
			told[[2]string{f.RunID, f.Step}] = true
		}
	}
	for i := range cs.events {
		e := &cs.events[i]
		if e.typ != "step_succeeded" && e.typ != "step_failed" && e.typ != "step_skipped" && e.typ != "step_timeout" &&
			(len(e.typ) < 4 || e.typ[:4] != "run_" || e.typ == "run_started") {
			continue
		}
		if runs == nil && len(cs.runs)+len(cs.created) > indexAfter {
			runs = cs.runIndex()
		}
		run, steps := cs.runOf(e.owner, runs)
		if run == nil {
			continue // a task's event, or a run this write did not hold
		}
		if e.typ[:4] == "run_" {
			if !status.RunTerminal(run.Status) || e.typ != "run_"+run.Status || run.FinishedAt == nil {
				continue
			}
			add(store.Finished{
				RunID: run.ID, WorkflowID: run.WorkflowID, Version: run.Version,
				Status: run.Status, Error: run.Error,
				StartedAt: run.StartedAt, FinishedAt: *run.FinishedAt, TriggerHeaders: run.TriggerHeaders,
			})
			// Steps under way when the run was cancelled or timed out end
			// with it, without events of their own (a step told by its
			// own event in this write, a cancelled task's, is not told
			// again).
			if run.Status != status.RunCancelled && run.Status != status.RunTimeout {
				continue
			}
			if told == nil {
				told = make(map[[2]string]bool, len(out))
				for i := range out {
					told[[2]string{out[i].RunID, out[i].Step}] = true
				}
			}
			for _, st := range steps {
				if st.Status == status.StepCancelled && st.StartedAt != nil && st.FinishedAt != nil &&
					st.FinishedAt.Equal(*run.FinishedAt) && !told[[2]string{run.ID, st.Name}] {
					add(stepFinished(run, st, *st.FinishedAt))
				}
			}
			continue
		}
		st := stepNamed(steps, e.step)
		if st == nil || !status.StepTerminal(st.Status) || (told != nil && told[[2]string{run.ID, st.Name}]) {
			continue // (told: with its run, whose event came first)
		}
		end := fromTS(e.at)
		if st.FinishedAt != nil {
			end = *st.FinishedAt
		}
		add(stepFinished(run, st, end))
	}
	return out
}

// stepFinished tells of st, a step of run, ended at end.
func stepFinished(run *store.Run, st *store.StepRun, end time.Time) store.Finished {
	f := store.Finished{
		RunID: run.ID, WorkflowID: run.WorkflowID, Version: run.Version,
		Step: st.Name, Type: st.Type, Status: st.Status, Attempt: st.Attempt, Error: st.Error,
		TriggerHeaders: run.TriggerHeaders,
	}
	if st.StartedAt != nil {
		f.StartedAt = *st.StartedAt
	}
	f.FinishedAt = end
	return f
}

// runOf is the run id names as this write leaves it, with its steps: a
// run it locked, or one it created. index, if not nil, is runIndex's.
func (c *changeset) runOf(id string, index map[string]int) (*store.Run, []*store.StepRun) {
	if index != nil {
		i, ok := index[id]
		switch {
		case !ok:
			return nil, nil
		case i < len(c.runs):
			return c.runs[i].run, c.runs[i].steps
		default:
			nr := c.created[i-len(c.runs)]
			return &nr.Run, nr.Steps
		}
	}
	for _, rt := range c.runs {
		if rt.run.ID == id {
			return rt.run, rt.steps
		}
	}
	for _, nr := range c.created {
		if nr.Run.ID == id {
			return &nr.Run, nr.Steps
		}
	}
	return nil, nil
}

// runIndex indexes the runs runOf finds: the write's locked runs, then
// (after len(c.runs)) the ones it created.
func (c *changeset) runIndex() map[string]int {
	m := make(map[string]int, len(c.runs)+len(c.created))
	for i, rt := range c.runs {
		m[rt.run.ID] = i
	}
	for i, nr := range c.created {
		m[nr.Run.ID] = len(c.runs) + i
	}
	return m
}

func stepNamed(steps []*store.StepRun, name string) *store.StepRun {
	for _, st := range steps {
		if st.Name == name {
			return st
		}
	}
	return nil
}
