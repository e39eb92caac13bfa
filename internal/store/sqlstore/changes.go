package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// changeset is what run and task transactions write, kept as rows until the
// transaction's work is done and then written set-wise: one UPDATE … FROM
// (VALUES …) per table and one multi-row INSERT per table, however many
// runs, steps and tasks changed. A batch of completions of many runs costs
// about ten statements, not ten per completion; statements, not rows, were
// the cost of a step on both backends.
//
// A changeset that is dropped (its request failed) has written nothing.
type changeset struct {
	newRuns   [][]any         // rows of runs to insert
	created   []*store.NewRun // the runs of newRuns (finishedIn)
	newSteps  []*store.StepRun
	runs      []*runTx // runs whose row changed (status or event sequence)
	steps     []*store.StepRun
	tasks     []*taskTx // tasks whose row changed
	newTasks  []*store.Task
	events    []eventRow
	queue     []store.QueueItem
	dropQueue []string      // run ids
	cancel    []cancelTasks // runs' tasks cancelled if unfinished
	note      note
	// the version cache's entries once this commits (Postgres)
	cacheIDs  []string
	cacheRuns []*cachedRun
	xid       string // Postgres: the writing transaction's id, once flushed
	// stepsOut is how many steps flush wrote to step_runs from their
	// run's row (an upper bound on the step rows it inserted there).
	stepsOut int
	// placed is, for each run whose row flush wrote, the names of its
	// steps that row now holds (runTx.inRow once this commits).
	placed map[string]map[string]bool
	// packed is, for each run whose row flush wrote, its steps' forms in
	// that row (cachedRun.packed once this commits), for runs of
	// packedMemoSteps or more steps.
	packed map[string][]string
	// versions, set for an optimistic batch (Postgres), are the row
	// versions its runs and tasks were decided on, by id: its updates
	// write a row only at that version (updateByID).
	versions map[string]string
	// stepAt, runSet and taskSet index steps, runs and tasks once there
	// are more than indexAfter of them: each write looks for the row it
	// rewrites, and with a scan a SQLite fire transaction of a thousand
	// wake-ups spent 12 µs a wake-up doing so.
	stepAt  map[[2]string]int
	runSet  map[*runTx]struct{}
	taskSet map[*taskTx]struct{}
}

// indexAfter is how many steps, runs or tasks a changeset scans before it
// indexes them.
const indexAfter = 16

type eventRow struct {
	owner string // run or task id
	seq   int64
	typ   string
	step  string
	// data is the encoded JSON, or nil. Bytes, not a string: most events
	// go into their owner's row, which copies them anyway, and a string
	// boxed as a column value was two allocations an event.
	data []byte
	at   int64
	// cap is how many of its owner's events the owner's row holds:
	// taskRowEvents for a task, runEvents for a run.
	cap int64
	// implied: a task's created event, which its row implies (see
	// createdMark) rather than holds.
	implied bool
}

// createdMark opens the events of a task's row that holds its created
// event only by implication (migration 0016): the event is seq 1, at the
// task's created_at, its data createdData of the row's run_id, step and
// type, none of which a task's later writes change. Written out it was a
// quarter of a job's task row (≈150 bytes), rewritten with each of the
// row's three versions. Rows from before that migration, whose events
// start with the event itself, are read as they are.
const createdMark = "~"

// taskRowEvents is how many of a task's events its own row holds (see
// migration 0009): a job's whole life (created, claimed, succeeded) and a
// few retries. Events numbered after it go to the events table, so a
// task that heartbeats for hours does not grow its row, which every
// update rewrites.
const taskRowEvents = 8

// runRowEvents is how many of a run's events its own row holds (see
// migration 0014): a one-step run's whole life (started, step started,
// step succeeded, completed), a sleep and its next step, the first
// three steps of a chain. Later events go to the events table, so a long
// run does not grow the row every one of its updates rewrites.
const runRowEvents = 8

// runRowEventsSteps: a run of more than this many steps that keeps its
// steps in its row keeps none of its events there. Both would make its
// row pass the ≈2 KB at which Postgres compresses a row at every write; a
// chain10 run's steps in its row, its events in event rows, cost
// Postgres ≈17 % less statement time than step rows and events in the
// run's row.
const runRowEventsSteps = 4

// runEvents is how many of its events the row of a run of this many
// steps holds; short says whether the run keeps its steps in its row
// (Store.shortRun): a longer run's row has room for its events.
func runEvents(steps int, short bool) int64 {
	if short && steps > runRowEventsSteps {
		return 0
	}
	return runRowEvents
}

// inRow says whether e is written into its owner's row.
func (e eventRow) inRow() bool { return e.seq <= e.cap }

// rowJSON appends e as a task's or run's row holds it (see migrations
// 0009, 0014 and 0018): ",[seq,"type",at]", then the step if it has one
// and its data if it has some: ",[seq,"type",at,"step",data]". The
// fourth element is the step when it is a string and the data otherwise;
// data that is itself a string comes fifth, after the step even when
// that is "". The positions replace the keys of the object form the rows
// held before migration 18 ({"seq":…,"type":…,"step":…,"data":…,"at":…}),
// which unpackEvents still reads: a quarter of an event's bytes, 6 % of
// Postgres's WAL in the jobs workload and a tenth of its runs' pages.
func (e eventRow) rowJSON(b []byte) []byte {
	if e.implied {
		return append(b, createdMark...)
	}
	b = append(b, rowJSONHead...)
	b = strconv.AppendInt(b, e.seq, 10)
	return e.rowJSONTail(b)
}

// rowJSONHead is what rowJSON writes before the event's number.
const rowJSONHead = `,[`

// rowJSONTail is what rowJSON writes after the event's number.
func (e eventRow) rowJSONTail(b []byte) []byte {
	b = append(b, ',')
	b = appendJSONString(b, e.typ)
	b = append(b, ',')
	b = strconv.AppendInt(b, e.at, 10)
	if e.step != "" || (e.data != nil && isJSONString(e.data)) {
		b = append(b, ',')
		b = appendJSONString(b, e.step)
	}
	if e.data != nil {
		b = append(b, ',')
		b = append(b, e.data...)
	}
	return append(b, ']')
}

// isJSONString says whether the JSON value v is a string.
func isJSONString(v []byte) bool {
	for _, c := range v {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c == '"'
	}
	return false
}

// eventRows are the rows of the events table c writes: each owner's
// events (those not in its row) packed into rows of up to packEvents,
// the last in the row's columns and the ones before it in earlier (see
// migration 0010). Rows were a large part of a step's cost on Postgres,
// each an index entry and a heap tuple; the events of one transaction
// are read together anyway.
func (c *changeset) eventRows() [][]any {
	var order []string
	byOwner := map[string][]eventRow{}
	for _, e := range c.events {
		if e.inRow() {
			continue
		}
		if _, ok := byOwner[e.owner]; !ok {
			order = append(order, e.owner)
		}
		byOwner[e.owner] = append(byOwner[e.owner], e)
	}
	var rows [][]any
	var earlier []byte
	for _, owner := range order {
		evs := byOwner[owner]
		for len(evs) > 0 {
			earlier = earlier[:0]
			n := 1
			for n < len(evs) && n < packEvents && len(earlier) < packBytes {
				earlier = evs[n-1].rowJSON(earlier)
				n++
			}
			last := evs[n-1]
			var data, more any
			if last.data != nil {
				data = string(last.data)
			}
			if n > 1 {
				more = string(earlier)
			}
			rows = append(rows, []any{owner, last.seq, last.typ, last.step, data, last.at, more})
			evs = evs[n:]
		}
	}
	return rows
}

// newRows is about how many rows c inserts into each table the
// background ANALYZE covers (Store.grew, in AnalyzeTables' order): runs,
// step rows (new ones, and steps leaving their run's row, which flush
// counts into stepsOut), tasks and queue items. Events are not counted:
// they go to their task's or run's row or to the events table, which is
// not analyzed, and counting them made the refresh run more often than
// those tables grew.
func (c *changeset) newRows() [len(AnalyzeTables)]int {
	return [...]int{len(c.newRuns), len(c.newSteps) + c.stepsOut, len(c.newTasks), len(c.queue)}
}

// A row of the events table packs at most packEvents events, and stops
// adding once the earlier ones take packBytes: a fan-out's step starts
// or large step outputs make several rows, not one of unbounded size.
const (
	packEvents = 16
	packBytes  = 4096
)

// eventBufs lend rowEvents a buffer that has grown to a batch's events
// before (up to maxEventBuf), so that only the string made of it is new.
var eventBufs = sync.Pool{New: func() any { return new([]byte) }}

const maxEventBuf = 1 << 20

// rowEvents is what each task's and run's row gains from c, by id: its
// events that go in the row, in order, as rowJSON.
func (c *changeset) rowEvents() map[string]string {
	// An owner's events are nearly always next to each other in c.events
	// (one request writes them together), so each run of them is one
	// segment of a single buffer, made a string once and sliced, and the
	// map is sized for the runs: growing it and assigning to it per event
	// were half of this function's time in the jobs benchmark, and a
	// string per owner two of a job's objects.
	type segment struct {
		owner      string
		start, end int
	}
	var segs []segment
	n, owner := 0, ""
	for _, e := range c.events {
		if e.inRow() {
			if n == 0 || e.owner != owner {
				n++
				owner = e.owner
			}
		}
	}
	if n == 0 {
		return nil
	}
	segs = make([]segment, 0, n)
	bp := eventBufs.Get().(*[]byte)
	b := (*bp)[:0]
	for _, e := range c.events {
		if !e.inRow() {
			continue
		}
		if len(segs) == 0 || e.owner != segs[len(segs)-1].owner {
			segs = append(segs, segment{owner: e.owner, start: len(b)})
		}
		b = e.rowJSON(b)
		segs[len(segs)-1].end = len(b)
	}
	all := string(b)
	if cap(b) <= maxEventBuf {
		*bp = b
		eventBufs.Put(bp)
	}
	out := make(map[string]string, len(segs))
	for _, sg := range segs {
		out[sg.owner] += all[sg.start:sg.end] // no copy unless an owner's events were apart
	}
	return out
}

// apply runs one request of a batch with its writes in a changeset of its
// own, pointing run rt (nil for a standalone task) at it: they join c when
// the request succeeds; when it fails they are dropped and rt's in-memory
// state is restored, so later requests of the run and the writes of earlier
// ones see only what will commit.
//
// shared says whether other requests of the batch use rt: only then is its
// state copied beforehand to be restored. A run with one request is left
// as the failure left it; nothing of it is written or cached (the caches
// take only what changesets wrote).
func (c *changeset) apply(rt *runTx, shared bool, fn func(sub *changeset) error) error {
	sub := &changeset{}
	var snap runSnap
	if rt != nil {
		if shared {
			snap = rt.snapshot()
		}
		rt.cs = sub
	}
	if err := fn(sub); err != nil {
		if rt != nil && shared {
			rt.restore(snap)
		}
		return err
	}
	c.merge(sub)
	return nil
}

// merge adds o's writes; rows both touched (the same run's, in a batch) are
// kept once: they are written from the objects' final state.
func (c *changeset) merge(o *changeset) {
	for _, r := range o.runs {
		c.run(r)
	}
	for _, s := range o.steps {
		c.step(s)
	}
	for _, t := range o.tasks {
		c.task(t)
	}
	c.newTasks = append(c.newTasks, o.newTasks...)
	c.events = append(c.events, o.events...)
	c.queue = append(c.queue, o.queue...)
	c.dropQueue = append(c.dropQueue, o.dropQueue...)
	c.cancel = append(c.cancel, o.cancel...)
	c.note.merge(o.note)
}

// newRun adds a run with its steps, queue items, tasks and events.
// short says whether the run's steps may be kept in its row (see
// Store.shortRun).
func (c *changeset) newRun(nr *store.NewRun, now time.Time, short bool) error {
	r := &nr.Run
	headers, err := headersJSON(r.TriggerHeaders)
	if err != nil {
		return err
	}
	var seq int64
	if err := c.addEvents(r.ID, runEvents(len(nr.Steps), short), &seq, now, nr.Events); err != nil {
		return err
	}
	var inBuf [16]bool
	in := packedIn(nr.Steps, short, nil, inBuf[:])
	for i, st := range nr.Steps {
		st.RunID = r.ID
		if !in[i] {
			c.newSteps = append(c.newSteps, st)
		}
	}
	c.created = append(c.created, nr)
	// Room for the row's events, which flushParts appends: without it
	// the append copied the row into an array twice its size.
	c.newRuns = append(c.newRuns, append(make([]any, 0, 15), r.ID, r.WorkflowID, r.Version, r.Status, string(r.Input), string(headers), nullStr(r.IdempotencyKey), r.Error, seq, ts(r.ExpiresAt), ts(r.StartedAt), tsPtr(r.FinishedAt), ts(now), packSteps(nr.Steps, in)))
	for _, it := range nr.Queue {
		if it.Kind == store.KindRunExpire {
			return fmt.Errorf("run %s: %w", r.ID, store.ErrExpiryNotQueued)
		}
		it.RunID = r.ID
		c.queue = append(c.queue, it)
		c.note.queued(it.Kind, it.DueAt)
	}
	if runLive(r.Status) {
		c.note.queued(store.KindRunExpire, r.ExpiresAt)
	}
	for _, t := range nr.Tasks {
		t.RunID = r.ID
		c.addTask(t, now)
	}
	return nil
}

// sizeFor makes room for the runs nrs[i] for i in todo at once: appended
// one by one, a batch's events (96 bytes each) were copied into arrays
// twice the size again and again as they grew.
func (c *changeset) sizeFor(nrs []*store.NewRun, todo []int) {
	var evs, tasks, queue int
	for _, i := range todo {
		evs += len(nrs[i].Events) + 2*len(nrs[i].Tasks)
		tasks += len(nrs[i].Tasks)
		queue += len(nrs[i].Queue)
	}
	c.events = slices.Grow(c.events, evs)
	c.newTasks = slices.Grow(c.newTasks, tasks)
	c.queue = slices.Grow(c.queue, queue)
	c.newRuns = slices.Grow(c.newRuns, len(todo))
	c.created = slices.Grow(c.created, len(todo))
}

// headersJSON is how a run's trigger headers are stored: no headers as {}.
func headersJSON(h map[string]string) ([]byte, error) {
	if h == nil {
		return []byte("{}"), nil
	}
	return json.Marshal(h)
}

// addTask adds a new task and its created event, and its claimed event
// when it is created leased (handed to a completing worker at once).
func (c *changeset) addTask(t *store.Task, now time.Time) {
	prepareTask(t, now, &c.note)
	c.newTasks = append(c.newTasks, t)
	c.events = append(c.events, eventRow{owner: t.ID, seq: 1, typ: "created", at: ts(now), cap: taskRowEvents, implied: true})
	if createdLeased(t) {
		c.note.c.Leased = append(c.note.c.Leased, t.LeaseToken)
		how := "eager" // taken by the worker whose completion started it
		if t.ToWaitingClaim {
			how = "waiting_claim"
		}
		c.events = append(c.events, eventRow{owner: t.ID, seq: 2, typ: "claimed", data: claimedData(t, how), at: ts(now), cap: taskRowEvents})
	}
}

func createdLeased(t *store.Task) bool {
	return t.Status == status.TaskLeased && t.LeaseUntil != nil
}

// step records a step to write; one row per step, the latest copy (two in
// one UPDATE … FROM would leave which one wins to the database).
// step adds s, or puts it in the place of the step of the same run and
// name.
func (c *changeset) step(s *store.StepRun) {
	if c.stepAt == nil && len(c.steps) < indexAfter {
		for i, x := range c.steps {
			if x == s || (x.RunID == s.RunID && x.Name == s.Name) {
				c.steps[i] = s
				return
			}
		}
		c.steps = append(c.steps, s)
		return
	}
	if c.stepAt == nil {
		c.stepAt = make(map[[2]string]int, 2*len(c.steps))
		for i, x := range c.steps {
			c.stepAt[stepKey(x)] = i
		}
	}
	k := stepKey(s)
	if i, ok := c.stepAt[k]; ok {
		c.steps[i] = s
		return
	}
	c.stepAt[k] = len(c.steps)
	c.steps = append(c.steps, s)
}

func stepKey(s *store.StepRun) [2]string { return [2]string{s.RunID, s.Name} }

// run marks r's row to be written; the row's updated_at is then the
// transaction's time, the run's last write (see runTx.Now).
func (c *changeset) run(r *runTx) {
	r.updatedAt = r.now
	c.runs = addOnce(c.runs, &c.runSet, r)
}

func (c *changeset) task(t *taskTx) { c.tasks = addOnce(c.tasks, &c.taskSet, t) }

// addOnce appends x to xs unless it is there, indexing xs in set once it
// holds indexAfter.
func addOnce[T comparable](xs []T, set *map[T]struct{}, x T) []T {
	if *set == nil {
		if len(xs) < indexAfter {
			if slices.Contains(xs, x) {
				return xs
			}
			return append(xs, x)
		}
		*set = make(map[T]struct{}, 2*len(xs))
		for _, y := range xs {
			(*set)[y] = struct{}{}
		}
	}
	if _, ok := (*set)[x]; ok {
		return xs
	}
	(*set)[x] = struct{}{}
	return append(xs, x)
}

// addEvents numbers events after *seq and keeps them; rowCap is how many
// of the owner's events its row holds (eventRow.cap).
func (c *changeset) addEvents(owner string, rowCap int64, seq *int64, now time.Time, evs []store.NewEvent) error {
	for _, e := range evs {
		*seq++
		var data []byte
		if e.Data != nil {
			b, err := encodeData(e.Data)
			if err != nil {
				return fmt.Errorf("encode event: %w", err)
			}
			data = b
		}
		c.events = append(c.events, eventRow{owner: owner, seq: *seq, typ: e.Type, step: e.Step, data: data, at: ts(now), cap: rowCap})
	}
	return nil
}

// column types of set-wise updates, cast so that VALUES rows type the same
// on both backends.
const (
	cInt   = "int"
	cText  = "text"
	cBytes = "bytes"
	cBool  = "bool"
)

// postgres: writes and id lists go as arrays, and writes as one statement.
func (s *Store) postgres() bool { return s.d.Name == "postgres" }

func (s *Store) cast(typ string) string {
	pg := s.postgres()
	switch typ {
	case cInt:
		return "BIGINT"
	case cBytes:
		if pg {
			return "BYTEA"
		}
		return "BLOB"
	case cBool:
		if pg {
			return "BOOLEAN"
		}
		return "INTEGER"
	}
	return "TEXT"
}

// part is one generated write statement (with ? placeholders) and its
// arguments.
type part struct {
	key  stmtKey
	text func() string
	args []any
	what string // for errors
	// guard, when not 0, is how many rows the statement must write (it
	// returns one row for each): a guarded update of an optimistic batch.
	guard int
}

// updateParts are the statements that update rows. On SQLite: up to
// rowByRow rows, a keyed UPDATE each; more, UPDATE … FROM (VALUES …)
// statements of at most 128 rows each, in power-of-two sizes. On
// Postgres it is one UPDATE … FROM
// (arrayRows) of one array per column, whatever the number of rows: one
// statement text per table, so each connection prepares it once and the
// planner plans a handful of parameters instead of thousands (planning the
// VALUES form took ≈0.5 ms per statement there).
func (s *Store) updateParts(table, form string, keys, set []string, types []string, rows [][]any) []part {
	if len(rows) == 0 {
		return nil
	}
	kind := "update"
	if form != "" {
		kind += " (" + form + ")" // the statement caches key on it
	}
	if s.postgres() {
		return []part{{key: stmtKey{kind, table, 0}, args: columns(rows, len(types)), what: "update " + table,
			text: func() string { return s.updateArrays(table, keys, set, types) }}}
	}
	if len(rows) <= rowByRow {
		key, text := stmtKey{kind + " one", table, 1}, func() string { return s.updateOne(table, keys, set, types) }
		out := make([]part, 0, len(rows))
		for _, r := range rows {
			out = append(out, part{key: key, args: r, what: "update " + table, text: text})
		}
		return out
	}
	return chunked(rows, len(types), func(n int, args []any) part {
		return part{key: stmtKey{kind, table, n}, args: args, what: "update " + table,
			text: func() string { return s.updateText(table, keys, set, types, n) }}
	})
}

// rowByRow is the most rows SQLite updates with a statement each rather
// than one UPDATE … FROM (VALUES …): SQLite runs that as a join over the
// VALUES, materialized first, which costs more than the lookups it saves
// for a few rows. A chain10 group updates ≈4 tasks and runs: +5 % runs a
// second, −12 % of the machine's CPU a run (three pairs each way); 32
// beat 8 (chain10 +8 % at 16 handlers, +7 % at 64), and a statement a
// row for any number, in jobs whose groups update up to 128, was slower
// than 8 (−1.6 %) and no better than 32.
const rowByRow = 32

// updateOne is UPDATE … WHERE keys for one row (SQLite), its parameters
// numbered as updateText's one row has them.
func (s *Store) updateOne(table string, keys, set, types []string) string {
	var sb strings.Builder
	sb.WriteString("UPDATE " + table + " SET ")
	for i, c := range set {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(setExpr(table, c, fmt.Sprintf("CAST(?%d AS %s)", len(keys)+i+1, s.cast(types[len(keys)+i]))))
	}
	sb.WriteString(" WHERE ")
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(" AND ")
		}
		fmt.Fprintf(&sb, "%s = CAST(?%d AS %s)", k, i+1, s.cast(types[i]))
	}
	return sb.String()
}

// chunked makes SQLite's statements for rows of width values: one for at
// most 128 rows at a time, in power-of-two counts (few statement texts),
// mk building the statement of n rows with their values in args.
func chunked(rows [][]any, width int, mk func(n int, args []any) part) []part {
	var out []part
	for len(rows) > 0 {
		batch := rows[:chunk(len(rows), 128)]
		rows = rows[len(batch):]
		args := make([]any, 0, len(batch)*width)
		for _, r := range batch {
			args = append(args, r...)
		}
		out = append(out, mk(len(batch), args))
	}
	return out
}

// insertParts are multi-row INSERTs of rows of len(types) values each (on
// Postgres one INSERT … SELECT of column arrays (arrayRows), as in
// updateParts).
func (s *Store) insertParts(table, cols string, types []string, rows [][]any) []part {
	return s.insertOn(table, cols, "", types, rows)
}

// deleteParts delete the rows of table whose keys are those of rows.
func (s *Store) deleteParts(table string, keys []string, rows [][]any) []part {
	match := make([]string, len(keys))
	for i, k := range keys {
		match[i] = table + "." + k + " = v." + k
	}
	if s.postgres() {
		types := make([]string, len(keys))
		for i := range types {
			types[i] = cText
		}
		return []part{{key: stmtKey{"delete", table, 0}, args: columns(rows, len(keys)), what: "delete " + table,
			text: func() string {
				return "DELETE FROM " + table + " USING (" + s.arrayRows(types, keys) + ") AS v WHERE " + strings.Join(match, " AND ")
			}}}
	}
	ph := "(" + placeholders(len(keys)) + ")"
	return chunked(rows, len(keys), func(n int, args []any) part {
		return part{key: stmtKey{"delete", table, n}, args: args, what: "delete " + table, text: func() string {
			return "DELETE FROM " + table + " WHERE (" + strings.Join(keys, ", ") + ") IN (VALUES " + strings.TrimSuffix(strings.Repeat(ph+", ", n), ", ") + ")"
		}}
	})
}

// upsertParts are insertParts whose rows, where one with the same keys
// exists, set its columns set instead.
func (s *Store) upsertParts(table, cols string, keys, set, types []string, rows [][]any) []part {
	sets := make([]string, len(set))
	for i, c := range set {
		sets[i] = c + " = excluded." + c
	}
	return s.insertOn(table, cols, " ON CONFLICT ("+strings.Join(keys, ", ")+") DO UPDATE SET "+strings.Join(sets, ", "), types, rows)
}

// insertOn is insertParts with an ON CONFLICT clause, on ("" for none).
func (s *Store) insertOn(table, cols, on string, types []string, rows [][]any) []part {
	n := len(types)
	kind, what := "insert", "insert "+table
	if on != "" {
		kind, what = "upsert", "upsert "+table
	}
	if s.postgres() {
		return []part{{key: stmtKey{kind, table, 0}, args: columns(rows, n), what: what,
			text: func() string { return "INSERT INTO " + table + " (" + cols + ") " + s.arrayRows(types, nil) + on }}}
	}
	ph := "(" + placeholders(n) + ")"
	return chunked(rows, n, func(k int, args []any) part {
		return part{key: stmtKey{kind, table, k}, args: args, what: what, text: func() string {
			return "INSERT INTO " + table + " (" + cols + ") VALUES " + strings.TrimSuffix(strings.Repeat(ph+",", k), ",") + on
		}}
	})
}

// columns turns rows of n values into n column arrays (Postgres array
// parameters; nil elements are NULL).
func columns(rows [][]any, n int) []any {
	cols := make([]any, n)
	// One array for all the columns, each a full slice of its part (one
	// allocation, not one per column: they were a twelfth of the objects
	// a chain10 step allocated).
	all := make([]any, n*len(rows))
	for j := range cols {
		col := all[j*len(rows) : (j+1)*len(rows) : (j+1)*len(rows)]
		for i, r := range rows {
			col[i] = r[j]
		}
		cols[j] = col
	}
	return cols
}

// arrayRows is the rows of one array parameter per column, a column of
// each, named names (nil: unnamed, for INSERT … SELECT):
// SELECT unnest(CAST(? AS T[])) AS name, … . The unnests run in lockstep
// in the select list (a ProjectSet node). unnest(a, b, …) in FROM would
// be a Function Scan of one function per column, and a Function Scan
// first copies each function's rows into a tuplestore of its own: ≈21 µs
// of Postgres's CPU a column (pgbench, two-element arrays: 16 columns
// 2,900 statements a second against 19,000 for 2), against ≈0.35 µs in
// the select list. A report batch's write statement has ≈56 columns, so
// that was ≈1.1 ms of every such statement, whatever its rows.
func (s *Store) arrayRows(types, names []string) string {
	var sb strings.Builder
	sb.WriteString("SELECT ")
	for j, t := range types {
		if j > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("unnest(CAST(? AS " + s.cast(t) + "[]))")
		if names != nil {
			sb.WriteString(" AS " + names[j])
		}
	}
	return sb.String()
}

// updateArrays is UPDATE … FROM (arrayRows of keys…, set…) AS v.
func (s *Store) updateArrays(table string, keys, set, types []string) string {
	var sb strings.Builder
	sb.WriteString("UPDATE " + table + " SET ")
	names := make([]string, len(set))
	for i, c := range set {
		if i > 0 {
			sb.WriteString(", ")
		}
		names[i] = strings.TrimPrefix(c, "+")
		sb.WriteString(setExpr(table, c, "v."+names[i]))
	}
	sb.WriteString(" FROM (" + s.arrayRows(types, append(slices.Clip(keys), names...)) + ") AS v WHERE ")
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(" AND ")
		}
		if k == verKey {
			// Only a row still at the version the batch was decided on.
			fmt.Fprintf(&sb, "%s.xmin = CAST(v.%s AS xid)", table, verKey)
			continue
		}
		fmt.Fprintf(&sb, "%s.%s = v.%s", table, k, k)
	}
	if slices.Contains(keys, verKey) {
		sb.WriteString(" RETURNING 1")
	}
	return sb.String()
}

// guardFailed is the error text of a guarded statement whose rows changed
// since its batch read them (withStmt).
const guardFailed = "ferry: optimistic batch: a row changed since it was read; the batch is decided again under locks"

// verKey is the key column of a guarded update (updateByID): the row's
// version (its xmin) as the batch read it.
const verKey = "ver"

// updateByID is updateParts of rows keyed by id, guarded when c is an
// optimistic batch (see optimistic.go): each row is written only if its
// version is still c.versions', and the statement fails unless all are.
func (s *Store) updateByID(c *changeset, table string, set, types []string, rows [][]any) []part {
	if c.versions == nil || len(rows) == 0 {
		return s.updateParts(table, "", []string{"id"}, set, types, rows)
	}
	for i, r := range rows {
		rows[i] = slices.Insert(r, 1, any(c.versions[r[0].(string)]))
	}
	// In id order, the order the statement locks them in (a nested loop
	// over the arrays; see Dialect.Generic), as the locking way's reads.
	slices.SortFunc(rows, func(a, b []any) int { return strings.Compare(a[0].(string), b[0].(string)) })
	ps := s.updateParts(table, "guarded", []string{"id", verKey}, set, append([]string{cText, cText}, types[1:]...), rows)
	ps[0].guard = len(rows) // Postgres only: one part
	return ps
}

// exec runs parts in order. On Postgres they go as one statement, each
// part a data-modifying WITH clause of column arrays: one round trip and
// one plan instead of one per table, which was most of a batch's time
// there. Its clauses see the same snapshot, so callers combine only writes
// of different rows. The statement also returns the transaction's id, the
// xmin of every row it wrote (the version cache's versions), kept in c.xid.
func (s *Store) exec(ctx context.Context, tx querier, c *changeset, parts []part) error {
	if !s.postgres() {
		for _, p := range parts {
			if _, err := tx.ExecContext(ctx, s.stmt(p.key, p.text), p.args...); err != nil {
				return fmt.Errorf("%s: %w", p.what, err)
			}
		}
		return nil
	}
	// A part has one parameter per column, so this split (Postgres takes
	// at most 65535 parameters) is only a guard.
	for len(parts) > 0 {
		n, params := 0, 0
		for n < len(parts) && (n == 0 || params+len(parts[n].args) <= maxStmtParams) {
			params += len(parts[n].args)
			n++
		}
		if err := s.execWith(ctx, tx, c, parts[:n]); err != nil {
			return err
		}
		parts = parts[n:]
	}
	return nil
}

// maxStmtParams keeps a combined statement well under Postgres's limit of
// 65535 parameters.
const maxStmtParams = 8192

// execWith sends parts as one statement of data-modifying WITH clauses.
func (s *Store) execWith(ctx context.Context, tx querier, c *changeset, parts []part) error {
	q, args := s.withStmt(parts)
	if err := tx.QueryRowContext(ctx, q, args...).Scan(&c.xid); err != nil {
		return fmt.Errorf("write %d tables: %w", len(parts), err)
	}
	return nil
}

// withStmt is parts as one statement of data-modifying WITH clauses that
// returns the transaction's id (Postgres).
func (s *Store) withStmt(parts []part) (string, []any) {
	var key strings.Builder
	var args []any
	for _, p := range parts {
		fmt.Fprintf(&key, "%s %s %d;", p.key.kind, p.key.table, p.key.rows)
		args = append(args, p.args...)
	}
	// A guarded statement checks its guarded clauses' counts, runs' first:
	// each clause runs when the check first reads it, so the runs' rows
	// are locked before the queue's and the tasks', the order every other
	// transaction takes them in. When a count falls short the check casts
	// guardFailed to an integer, which fails the statement with that text
	// in Postgres's log (a constant would fail it as it is planned); the
	// transaction is then rolled back, whatever its other clauses wrote.
	var guards []int
	for _, table := range []string{"runs", "queue", "tasks"} {
		for i, p := range parts {
			if p.guard > 0 && p.key.table == table {
				guards = append(guards, i)
				args = append(args, int64(p.guard))
			}
		}
	}
	q := s.stmt(stmtKey{"with", key.String(), len(parts)}, func() string {
		var sb strings.Builder
		for i, p := range parts {
			if i == 0 {
				sb.WriteString("WITH ")
			} else {
				sb.WriteString(", ")
			}
			fmt.Fprintf(&sb, "w%d AS (%s)", i, p.text())
		}
		if len(guards) == 0 {
			sb.WriteString(" SELECT pg_current_xact_id()::xid::text")
			return sb.String()
		}
		sb.WriteString(" SELECT CASE WHEN CAST(CASE WHEN ")
		for j, i := range guards {
			if j > 0 {
				sb.WriteString(" AND ")
			}
			fmt.Fprintf(&sb, "(SELECT count(*) FROM w%d) = ?", i)
		}
		fmt.Fprintf(&sb, " THEN '1' ELSE '%s' END AS int) = 1 THEN pg_current_xact_id()::xid::text END", guardFailed)
		return sb.String()
	})
	if s.d.SizeParams != nil {
		args = s.d.SizeParams(args)
	}
	return q, args
}

// stmtKey names a generated statement: its kind, table and row count
// (the columns of each table's statements never change).
type stmtKey struct {
	kind, table string
	rows        int
}

// stmt is the generated statement for k, built once (the first
// maxCachedStmts shapes are kept; combinations of batch sizes are many).
func (s *Store) stmt(k stmtKey, build func() string) string {
	if q, ok := s.stmts.Load(k); ok {
		return q.(string)
	}
	q := s.q(build())
	if s.stmtsN.Add(1) <= maxCachedStmts {
		s.stmts.Store(k, q)
	}
	return q
}

// GeneratedStatements are the texts of the statements the store has
// generated (its set-wise writes and their combinations) so far, for
// tests and diagnostics: a test can have Postgres explain each.
func (s *Store) GeneratedStatements() []string {
	var out []string
	s.stmts.Range(func(_, v any) bool {
		out = append(out, v.(string))
		return true
	})
	return out
}

// maxCachedStmts bounds the generated statements kept in memory.
const maxCachedStmts = 4096

// setExpr is the SET clause of column c from value v: c = v, or, for a
// column named "+c", c = table.c || v (appended to, as a task's events).
func setExpr(table, c, v string) string {
	if name, ok := strings.CutPrefix(c, "+"); ok {
		return name + " = " + table + "." + name + " || " + v
	}
	return c + " = " + v
}

// updateText is UPDATE … FROM (VALUES …) for n rows.
func (s *Store) updateText(table string, keys, set, types []string, n int) string {
	var sb strings.Builder
	sb.WriteString("UPDATE " + table + " SET ")
	for i, c := range set {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(setExpr(table, c, fmt.Sprintf("v.column%d", len(keys)+i+1)))
	}
	sb.WriteString(" FROM (VALUES ")
	for i := 0; i < n; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteByte('(')
		for j := range types {
			if j > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString("CAST(? AS " + s.cast(types[j]) + ")")
		}
		sb.WriteByte(')')
	}
	sb.WriteString(") AS v WHERE ")
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(" AND ")
		}
		fmt.Fprintf(&sb, "%s.%s = v.column%d", table, k, i+1)
	}
	return sb.String()
}

var (
	stepSet   = []string{"status", "attempt", "callback_token", "status_code", "duration_ms", "request", "body", "headers", "is_truncated", "blocked", "error", "wake_at", "started_at", "finished_at"}
	stepTypes = []string{cText, cText, cText, cInt, cText, cInt, cInt, cText, cBytes, cText, cBool, cBool, cText, cInt, cInt, cInt}
	taskSet   = []string{"status", "run_at", "attempt", "leased_by", "lease_token", "lease_until", "reclaimed", "cancel_requested", "last_error", "result", "updated_at", "finished_at", "event_seq", "+events"}
	taskTypes = []string{cText, cText, cInt, cInt, cText, cText, cInt, cBool, cBool, cText, cText, cInt, cInt, cInt, cText}
	runSet    = []string{"status", "error", "finished_at", "updated_at", "event_seq", "steps", "+events"}
	runTypes  = []string{cText, cText, cText, cInt, cInt, cInt, cText, cText}

	// SQLite maintains every index on a column an UPDATE sets, whether or
	// not its value changes: a run whose status, error and finish are as
	// read (every write of a run but its last) is written without them,
	// which keeps runs_by_workflow (runs_workflow_status when this was
	// measured) out of it (10 → 6 µs a row in chain10). Postgres compares
	// values itself (HOT updates) and always gets the full form. (The same for step_runs_token measured no gain.)
	runSetSeq   = runSet[3:]
	runTypesSeq = append([]string{cText}, runTypes[4:]...)

	runInsertTypes  = []string{cText, cText, cInt, cText, cText, cText, cText, cText, cInt, cInt, cInt, cInt, cInt, cText, cText}
	stepInsertTypes = append([]string{cText, cText, cInt, cText}, stepTypes[2:]...)
	taskInsertTypes = []string{cText, cText, cText, cText, cInt, cInt, cText, cInt, cInt, cInt, cText, cText, cInt, cBool, cBool, cText, cText, cText, cText, cInt, cInt, cInt, cInt, cText}
	queueTypes      = []string{cText, cText, cText, cInt, cInt}
	eventTypes      = []string{cText, cInt, cText, cText, cText, cInt, cText}
)

// flush writes the changeset inside tx. Order matters: tasks are written
// before a finished run's unfinished tasks are cancelled, so the task this
// transaction finished is not among them, and the cancellations' events
// are written after them. Queue rows for a run whose queue is dropped are
// not written at all (they would be dropped with it), so the drop sees
// only older rows, and every write before the cancellations can go as one
// statement (see exec).
func (s *Store) flush(ctx context.Context, tx querier, c *changeset) error {
	parts, events := s.flushParts(c)
	if err := s.writeParts(ctx, tx, c, parts, events); err != nil {
		return err
	}
	if s.cache != nil {
		s.cache.pendTasks(c) // staged if the request succeeds
	}
	return nil
}

// writeParts writes what flushParts built for c, the cancellations of its
// stopped runs' tasks between the parts and the events.
func (s *Store) writeParts(ctx context.Context, tx querier, c *changeset, parts []part, events func() []part) error {
	if len(c.cancel) == 0 {
		return s.exec(ctx, tx, c, append(parts, events()...))
	}
	if err := s.exec(ctx, tx, c, parts); err != nil {
		return err
	}
	if err := s.cancelTasks(ctx, tx, c); err != nil {
		return err
	}
	return s.exec(ctx, tx, c, events())
}

// flushParts is what flush writes: the parts before the cancellations,
// and the events (built after them, since they add events).
func (s *Store) flushParts(c *changeset) ([]part, func() []part) {
	var parts []part
	rowEvents := c.rowEvents()
	if len(c.newRuns) > 0 {
		rows := make([][]any, 0, len(c.newRuns))
		for _, r := range c.newRuns {
			rows = append(rows, append(r, rowEvents[r[0].(string)]))
		}
		parts = append(parts, s.insertParts("runs", "id, workflow_id, version, status, input, trigger_headers, idempotency_key, error, event_seq, expires_at, started_at, finished_at, updated_at, steps, events", runInsertTypes, rows)...)
	}
	if len(c.newSteps) > 0 {
		rows := make([][]any, 0, len(c.newSteps))
		for _, st := range c.newSteps {
			rows = append(rows, append([]any{st.RunID, st.Name, st.Position, st.Type}, stepArgs(st)...))
		}
		parts = append(parts, s.insertParts("step_runs", stepCols, stepInsertTypes, rows)...)
	}
	if len(c.newTasks) > 0 {
		rows := make([][]any, 0, len(c.newTasks))
		for _, t := range c.newTasks {
			rows = append(rows, append(taskInsertArgs(t), rowEvents[t.ID]))
		}
		parts = append(parts, s.insertParts("tasks", taskCols+", event_seq, events", taskInsertTypes, rows)...)
	}
	if len(c.tasks) > 0 {
		rows := make([][]any, 0, len(c.tasks))
		for _, t := range c.tasks {
			k := t.task
			// Room for the version updateByID puts in a guarded row: no
			// second array a row (the same size class as without).
			rows = append(rows, append(make([]any, 0, 16), k.ID, k.Status, ts(k.RunAt), k.Attempt, k.LeasedBy, nullStr(k.LeaseToken), tsPtr(k.LeaseUntil), k.Reclaimed, k.CancelRequested, k.LastError, nullJSON(k.Result), ts(k.UpdatedAt), tsPtr(k.FinishedAt), t.seq, rowEvents[k.ID]))
		}
		parts = append(parts, s.updateByID(c, "tasks", taskSet, taskTypes, rows)...)
	}
	// Each run's row is written with the steps it holds (see
	// packedsteps.go), and each step goes where its committed state now
	// belongs, whether this write changed it or not (a step the row held
	// under another build's rule may have to leave it):
	//   - into the run's row from a step_runs row: the row is deleted;
	//   - out of the run's row: upserted (an older build may have left a
	//     stale row behind);
	//   - staying in step_runs: updated, if this write changed it.
	// Where a step was is where it was read from (runTx.inRow), never
	// worked out again from rules that may have changed since.
	var written map[[2]string]*store.StepRun
	if len(c.steps) > 0 {
		written = make(map[[2]string]*store.StepRun, len(c.steps))
		for _, st := range c.steps {
			written[stepKey(st)] = st
		}
	}
	var stepRows, upserts, moved [][]any
	var runRows, seqOnly [][]any
	var inBuf [16]bool
	for _, r := range c.runs {
		committed := r.committedSteps(written)
		in := packedIn(committed, s.shortRun(len(r.steps)), r.base, inBuf[:])
		var placed map[string]bool
		for i, st := range committed {
			was, now := r.inRow[st.Name], in[i]
			switch {
			case now:
				if placed == nil {
					placed = make(map[string]bool, len(committed))
				}
				placed[st.Name] = true
				if !was {
					moved = append(moved, []any{r.run.ID, st.Name})
				}
			case was:
				upserts = append(upserts, append([]any{r.run.ID, st.Name, st.Position, st.Type}, stepArgs(st)...))
			case written[[2]string{r.run.ID, st.Name}] != nil:
				stepRows = append(stepRows, append([]any{r.run.ID, st.Name}, stepArgs(st)...))
			}
		}
		if c.placed == nil {
			c.placed = make(map[string]map[string]bool, len(c.runs))
		}
		c.placed[r.run.ID] = placed
		packed, forms := packStepsMemo(committed, in, r.base)
		if forms != nil {
			if c.packed == nil {
				c.packed = make(map[string][]string, len(c.runs))
			}
			c.packed[r.run.ID] = forms
		}
		if s.cache != nil && r.base != nil && r.base.run.Status == r.run.Status && r.base.run.Error == r.run.Error && timePtrEqual(r.base.run.FinishedAt, r.run.FinishedAt) {
			seqOnly = append(seqOnly, []any{r.run.ID, ts(r.updatedAt), r.seq, packed, rowEvents[r.run.ID]})
		} else {
			runRows = append(runRows, append(make([]any, 0, 9), r.run.ID, r.run.Status, r.run.Error, tsPtr(r.run.FinishedAt), ts(r.updatedAt), r.seq, packed, rowEvents[r.run.ID])) // room for a version, as tasks
		}
	}
	if len(stepRows) > 0 {
		parts = append(parts, s.updateParts("step_runs", "", []string{"run_id", "name"}, stepSet, stepTypes, stepRows)...)
	}
	if len(upserts) > 0 {
		parts = append(parts, s.upsertParts("step_runs", stepCols, []string{"run_id", "name"}, stepSet, stepInsertTypes, upserts)...)
	}
	c.stepsOut = len(upserts)
	if len(moved) > 0 {
		parts = append(parts, s.deleteParts("step_runs", []string{"run_id", "name"}, moved)...)
	}
	parts = append(parts, s.updateByID(c, "runs", runSet, runTypes, runRows)...)
	parts = append(parts, s.updateParts("runs", "seq only", []string{"id"}, runSetSeq, runTypesSeq, seqOnly)...)
	dropped := make(map[string]bool, len(c.dropQueue))
	for _, id := range c.dropQueue {
		dropped[id] = true
	}
	var queue [][]any
	for _, it := range c.queue {
		if !dropped[it.RunID] {
			queue = append(queue, []any{it.Kind, it.RunID, it.Step, it.Attempt, ts(it.DueAt)})
		}
	}
	if len(queue) > 0 {
		parts = append(parts, s.insertParts("queue", "kind, run_id, step, attempt, due_at", queueTypes, queue)...)
	}
	if len(c.dropQueue) > 0 {
		args := make([]any, len(c.dropQueue))
		for i, id := range c.dropQueue {
			args[i] = id
		}
		cond, args := s.inList("run_id", args)
		parts = append(parts, part{key: stmtKey{"drop", "queue", len(args)}, args: args, what: "drop queue",
			text: func() string { return `DELETE FROM queue WHERE ` + cond }})
	}
	events := func() []part {
		rows := c.eventRows()
		if len(rows) == 0 {
			return nil
		}
		return s.insertParts("events", "run_id, seq, type, step, data, at, earlier", eventTypes, rows)
	}
	return parts, events
}

func timePtrEqual(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// cancelTasks is a run's tasks to cancel if unfinished (RunTx.CancelTasks).
type cancelTasks struct {
	run *runTx
	ids []string
}

// cancelChunk is the most tasks one cancelling statement names on SQLite
// (two variables each): a timer transaction can stop a thousand runs of
// many task steps each, and SQLite takes at most 32,766 variables a
// statement. Postgres takes the ids and runs as two arrays.
const cancelChunk = 4096

// cancelTasks cancels the unfinished tasks named in c.cancel and adds
// their events. A task is found by its id and cancelled only if its
// run_id is the run that named it.
func (s *Store) cancelTasks(ctx context.Context, tx querier, c *changeset) error {
	var ids, runs []any // a task's id and the run that named it
	cancelled := map[string]bool{}
	for _, ct := range c.cancel {
		for _, id := range ct.ids {
			ids, runs = append(ids, id), append(runs, ct.run.run.ID)
		}
	}
	for len(ids) > 0 {
		n := len(ids)
		if !s.postgres() {
			n = chunk(n, cancelChunk)
		}
		if err := s.cancelTaskIDs(ctx, tx, c, ids[:n], runs[:n], cancelled); err != nil {
			return err
		}
		ids, runs = ids[n:], runs[n:]
	}
	c.unlease(cancelled, c.cancel[0].run.now)
	return nil
}

// cancelTaskIDs cancels the tasks with ids[i] of run runs[i] that are
// unfinished, adds their events to c and their ids to cancelled.
func (s *Store) cancelTaskIDs(ctx context.Context, tx querier, c *changeset, ids, runs []any, cancelled map[string]bool) error {
	now := ts(c.cancel[0].run.now)
	data := []byte(mustJSON(map[string]any{"reason": "run cancelled"}))
	// The event as rowJSON writes it, its number filled in by the UPDATE;
	// the row takes it while it holds fewer than taskRowEvents, else it is
	// written to the events table below.
	tail := string(eventRow{typ: "cancelled", data: data, at: now}.rowJSONTail(nil))
	args := []any{now, now, taskRowEvents, rowJSONHead, tail}
	var from, match string
	if s.postgres() {
		from, match = `(`+s.arrayRows([]string{cText, cText}, []string{"id", "run_id"})+`) AS v`, `tasks.id = v.id AND tasks.run_id = v.run_id`
		args = append(args, ids, runs)
	} else {
		// chunk made len(ids) a power of two: few statement texts.
		from, match = `(VALUES `+strings.TrimSuffix(strings.Repeat("(?, ?), ", len(ids)), ", ")+`) AS v`, `tasks.id = v.column1 AND tasks.run_id = v.column2`
		for i := range ids {
			args = append(args, ids[i], runs[i])
		}
	}
	key := stmtKey{"cancel", "tasks", len(ids)}
	if s.postgres() {
		key.rows = 0 // one text for any number
	}
	q := s.stmt(key, func() string {
		return `UPDATE tasks SET status = 'cancelled', cancel_requested = TRUE, finished_at = ?, updated_at = ?, event_seq = event_seq + 1,
			events = CASE WHEN event_seq < ? THEN events || CAST(? AS TEXT) || CAST(event_seq + 1 AS TEXT) || CAST(? AS TEXT) ELSE events END
		FROM ` + from + ` WHERE ` + match + ` AND tasks.status IN ('pending', 'leased') RETURNING tasks.id, tasks.event_seq`
	})
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("cancel tasks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			return err
		}
		// The task's cap, so the events table takes it only past the
		// row's share (inRow), as every task event.
		c.events = append(c.events, eventRow{owner: id, seq: seq, typ: "cancelled", data: data, at: now, cap: taskRowEvents})
		cancelled[id] = true
	}
	return rows.Err()
}

// unlease takes the tasks this changeset created leased and then cancelled
// (a later request of the batch ended their run) out of what its commit
// hands over: their objects say cancelled, and their tokens leave
// note.Leased, so no worker is given a task of a run that ended.
func (c *changeset) unlease(cancelled map[string]bool, now time.Time) {
	if len(cancelled) == 0 || len(c.note.c.Leased) == 0 {
		return
	}
	gone := map[string]bool{}
	for _, t := range c.newTasks {
		if cancelled[t.ID] && createdLeased(t) {
			gone[t.LeaseToken] = true
			t.Status, t.CancelRequested, t.FinishedAt, t.UpdatedAt = status.TaskCancelled, true, &now, now
		}
	}
	if len(gone) > 0 {
		c.note.c.Leased = slices.DeleteFunc(c.note.c.Leased, func(tok string) bool { return gone[tok] })
	}
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// inList is "col IN (…)" for vals of text, and inInts for BIGINT vals.
// On SQLite the list is padded to a power of two by repeating the last
// value, so a statement has few distinct texts and stays in SQLite's
// statement cache (parsing had come back as an eighth of the CPU). On
// Postgres it is "col = ANY(?)" with one array: one text whatever the
// count.
func (s *Store) inList(col string, vals []any) (string, []any) { return s.inTyped(col, cText, vals) }

func (s *Store) inInts(col string, vals []any) (string, []any) { return s.inTyped(col, cInt, vals) }

func (s *Store) inStrings(col string, vals []string) (string, []any) {
	args := make([]any, len(vals))
	for i, v := range vals {
		args[i] = v
	}
	return s.inList(col, args)
}

func (s *Store) inTyped(col, typ string, vals []any) (string, []any) {
	if s.postgres() {
		return col + " = ANY(CAST(? AS " + s.cast(typ) + "[]))", []any{vals}
	}
	n := 1
	for n < len(vals) {
		n *= 2
	}
	for len(vals) < n {
		vals = append(vals, vals[len(vals)-1])
	}
	return col + " IN (" + placeholders(n) + ")", vals
}

// chunk is the size of the next statement for n remaining rows: the largest
// power of two not above n or max, for the same reason as in.
func chunk(n, max int) int {
	c := 1
	for c*2 <= n && c*2 <= max {
		c *= 2
	}
	return c
}
