package postgres

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

const channel = "ferry_queue"

// genericPlans makes the rest of a transaction plan its statements once
// (generic plans) and through indexes: a generic plan cannot see how many
// keys an array argument holds and assumes ten, which made a hash join
// over every row of runs look cheaper than ten index lookups (0.16 of a
// write statement's 0.29 ms with 1,000 runs). The transactions that use it
// only read and write rows by key (see sqlstore's pipeline.go). The
// settings apply when a plan is made, and a connection keeps one generic
// plan per statement: the statements of these transactions are not sent
// outside them, so none runs on a plan made without the settings.
const genericPlans = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"

// Store is the Postgres store with LISTEN/NOTIFY wake-ups.
type Store struct {
	*sqlstore.Store
	dsn  string
	node string // this server's NOTIFY payload, so it ignores its own
	// scope is the schema Ferry's tables are in: the NOTIFY channel is
	// the database's, and servers of another deployment (another schema)
	// must not be woken by this one's commits.
	scope string

	local atomic.Pointer[func(store.Committed)]
	// listening is set while this node's LISTEN connection is up; heard
	// is when it last heard another node of its scope, self when its own
	// hello last came back (since base, on the monotonic clock). A node
	// that listens, hears its own hellos and has heard no other node for
	// peerTTL is alone, and its commits notify no one (see publish).
	listening   atomic.Bool
	heard, self atomic.Int64
	base        time.Time
	now         func() time.Time // time.Now; tests move it
	quiet       atomic.Int64     // commits not announced, the node being alone
	// ready is what this node's commits made ready since its last
	// NOTIFY, for the others (see publish); everything says the next
	// NOTIFY wakes them for all of it (a wake-up answering a hello).
	readyMu    sync.Mutex
	ready      peerReady
	everything atomic.Bool
	pub        chan struct{}
	stop       chan struct{}
	// peers are the other nodes of this scope heard from, with when
	// (since base); share is the timer share they make, computed at most
	// every shareEvery (see timerShare).
	peersMu   sync.Mutex
	peers     map[string]*peer
	share     atomic.Pointer[share]
	helloed   atomic.Bool // it said hello once: others may count it
	said      atomic.Bool // the listener up now said hello on its connection
	named     atomic.Bool // its check found its listener by name (mark)
	lastShare *share      // the share computed before (under peersMu)
	// sayMu orders this node's hellos and hi's with its goodbye: gone
	// says it said goodbye since a listener last started, and then no
	// hello or hi may go out (the others would count it again) until one
	// starts anew. run numbers the calls of Wakeups: the goodbye of one
	// that ended goes out only if no later one began (Run started again).
	// closed: the store closed, and no listener starts any more.
	sayMu  sync.Mutex
	gone   bool
	run    int64
	closed bool
	// listenFailing: the listener's last attempt failed (it warned once).
	// listens counts the listeners that said hello (tests read it);
	// listenRetry is how long the listener waits before it tries again
	// after a failed attempt, but one whose connection had said hello
	// listenUp or more before it ended tries again at once. Tests set
	// them.
	listenFailing atomic.Bool
	listens       atomic.Int64
	listenRetry   time.Duration
	listenUp      time.Duration
	pubDone       sync.WaitGroup
	closeOnce     sync.Once
}

// analyzeColumns are the columns the statistics refresh summarizes, by
// table (see Dialect.Analyze in Open for why these columns and sample).
var analyzeColumns = map[string]string{
	"runs":      "runs (id, workflow_id, status, expires_at, idempotency_key)",
	"step_runs": "step_runs (run_id, name, position, callback_token)",
	"tasks":     "tasks (id, status, priority, run_at, created_at, type, lease_until, run_id, idempotency_key)",
	"queue":     "queue (id, kind, run_id, due_at, lease_until)",
}

// analyzeStatement refreshes the planner's statistics of tables.
func analyzeStatement(tables []string) string {
	specs := make([]string, len(tables))
	for i, t := range tables {
		specs[i] = analyzeColumns[t]
	}
	return "SET LOCAL default_statistics_target = 10; ANALYZE " + strings.Join(specs, ", ")
}

// Open connects to the database at dsn (a postgres:// URL).
//
// The URL may carry ferry_max_conns=N (default 32): the most connections this
// server opens (a quarter of them for reads, the rest for writes, plus one
// for LISTEN). It is removed before the URL reaches Postgres.
func Open(ctx context.Context, dsn string) (*Store, error) {
	dsn, maxConns, err := takeMaxConns(dsn)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	// Reads get a pool of their own (a quarter of the connections): a
	// transaction that reads a definition or a task type on a cache miss
	// must not wait for a connection that another transaction holds while
	// it waits in turn.
	readers := max(1, maxConns/4)
	pool := func(n int) *sql.DB {
		db := stdlib.OpenDB(*cfg, stdlib.OptionAfterConnect(registerColumnCodecs))
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
		db.SetConnMaxIdleTime(5 * time.Minute)
		return db
	}
	db, rdb := pool(maxConns-readers), pool(readers)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		rdb.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := sqlstore.New(sqlstore.Dialect{
		Name: "postgres",
		// Postgres compresses a row of more than ≈2 KB at every write:
		// a chain10 run's row with its ten steps and its first eight
		// events in it passed that, and its statements then took 7–12 %
		// longer than with step rows. Such a run keeps no events in its
		// row (runEvents), and ten steps of a usual size stay under it.
		RunRowSteps:     10,
		Dollar:          true,
		LockRun:         " FOR UPDATE",
		SkipLocked:      " FOR UPDATE SKIP LOCKED",
		Lateral:         true,
		ShareLock:       " FOR SHARE",
		IsUnique:        isUnique,
		MigrationLock:   "SELECT pg_advisory_lock(7244917)",
		MigrationUnlock: "SELECT pg_advisory_unlock(7244917)",
		// Not events: it is only read through its primary key (run_id,
		// seq), which the planner uses with or without statistics, and
		// as the largest table it was most of each refresh's work.
		// Sampling a tenth of the default (3,000 rows a table, SET LOCAL
		// lasting for this implicit transaction only) is enough for what
		// the plans depend on, a handful of statuses and unique ids: it
		// halved the refreshes' Postgres time in jobs, chain10 and sleep
		// with the same time for every other statement. (Refreshing less
		// often, at four times the rows instead of two, did not: sleep's
		// claims went from an index walk to 6 ms each.) Only the columns
		// a query filters, joins or orders on are analyzed: the wide
		// ones (inputs, payloads, outputs, events) cost the most to
		// summarize and no plan reads their statistics; this halved the
		// refreshes again (fifteenth pass). A query that filters on
		// another column must add it here. (An ANALYZE of some columns
		// leaves n_mod_since_analyze as it is, so autovacuum still
		// analyzes these tables on its own schedule, as every other.)
		Analyze:    analyzeStatement,
		RowVersion: "r.xmin::text",
		Pipeline:   pipeline,
		Generic:    genericPlans,
		SizeParams: sizeParams,
	}, db, rdb)
	s.EnableVersionCache()
	var scope string
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(current_schema(), '')").Scan(&scope); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	st := &Store{Store: s, dsn: dsn, node: rand.Text(), scope: scope, base: time.Now(), now: time.Now, pub: make(chan struct{}, 1), stop: make(chan struct{}), peers: map[string]*peer{}, listenRetry: time.Second, listenUp: time.Second}
	s.ShareTimers(st.timerShare)
	st.heard.Store(math.MinInt64 / 2) // no other node heard yet
	st.self.Store(math.MinInt64 / 2)  // not alone before its first hello is back
	st.pubDone.Add(1)
	go st.publish()
	st.Store.OnCommit(st.committed)
	return st, nil
}

// OnCommit registers fn for this node's commits; other nodes learn of them
// through NOTIFY.
func (s *Store) OnCommit(fn func(store.Committed)) { s.local.Store(&fn) }

func (s *Store) committed(c store.Committed) {
	if fn := s.local.Load(); fn != nil {
		(*fn)(c)
	}
	s.readyMu.Lock()
	s.ready.add(c)
	s.readyMu.Unlock()
	if c.Registry {
		// The others drop their cached registry on a wake-up for
		// everything (a notification's own fields do not say it): a
		// type disabled here must stop being handed out there at once,
		// not once their one-second cache runs out.
		s.everything.Store(true)
	}
	select {
	case s.pub <- struct{}{}:
	default: // a notification is already pending: it covers this commit
	}
}

// notifyRetry is how soon a failed notification is sent again (for
// everything) when no commit sends one sooner.
const notifyRetry = time.Second

// signalPub asks publish for a notification (one already asked for
// covers it).
func (s *Store) signalPub() {
	select {
	case s.pub <- struct{}{}:
	default:
	}
}

// publish sends NOTIFY after commits, outside their transactions: a NOTIFY
// inside a transaction serialises every notifying commit on Postgres's
// notification lock, and one per commit woke every node for each step.
// Commits made while a NOTIFY is in flight share the next one.
//
// A NOTIFY says what its commits made ready (see peerReady): tasks, and
// of which types; the earliest HTTP attempt and timer. Another node wakes
// only what that concerns, as for its own commits. A wake-up that said
// nothing woke all of a node's dispatcher, timer loop and waiting claims
// to read the database, and with two busy nodes every commit sent one:
// chain10 ran at half the rate of one node, Postgres committing twelve
// times the transactions (twenty-eighth pass of docs/performance.md).
//
// A node alone notifies no one: a NOTIFY per commit was a statement, a
// round trip and a wake-up of the node's own listener, for nothing, on the
// one-server deployments most are (chain10 on Postgres +3–18 %). A node
// knows it is not alone once it has heard another node of its scope:
// every listening node says hello when its LISTEN starts and every
// helloEvery after, and any notification counts. Every node that hears a
// hello answers it with a wake-up for everything, so a newcomer learns of
// the others at once and whatever they committed before they heard it
// reaches it (a node woken so rechecks everything); a node that had been
// alone and hears another sends such a wake-up too, for what it
// committed meanwhile. A node notifies every commit while its listener is
// down, when it never listens, and when its own hellos stop coming back
// (a connection that died without an error).
func (s *Store) publish() {
	defer s.pubDone.Done()
	tick := time.NewTicker(helloEvery)
	defer tick.Stop()
	for {
		payload := s.node + ":" + s.scope
		presence := false // a hello or a hi: not after a goodbye
		select {
		case <-s.stop:
			return
		case <-tick.C:
			if !s.listening.Load() {
				continue
			}
			payload = s.hello()
			presence = true
		case <-s.pub:
			s.readyMu.Lock()
			ready := s.ready
			s.ready = peerReady{}
			s.readyMu.Unlock()
			everything := s.everything.Swap(false)
			if s.alone() {
				s.quiet.Add(1)
				continue
			}
			switch {
			case !everything:
				if ready.empty() {
					continue // the last NOTIFY took this commit's
				}
				payload = s.node + "?" + ready.encode() + ":" + s.scope
			case s.listening.Load():
				// A running node's wake-up for everything (an answer
				// to a hello, among others) says it runs: a newcomer
				// counts it in the timer share at once.
				payload = hiPrefix + s.node + s.mark() + ":" + s.scope
				presence = true
			}
		}
		sent := false
		switch {
		case presence && strings.HasPrefix(payload, hiPrefix):
			// After a goodbye, a hi's wake-up still goes out, as a
			// plain one.
			sent = s.present(payload, s.node+":"+s.scope)
		case presence:
			sent = s.present(payload, "")
		default:
			sent = s.notify(payload)
		}
		if !sent {
			// What it carried is not lost: the next notification wakes
			// the others for everything, and the next comes within a
			// second even if this node commits nothing more (a hello
			// would not do: it wakes nothing).
			s.everything.Store(true)
			time.AfterFunc(notifyRetry, s.signalPub)
		}
	}
}

const (
	// peerTTL is how long a node heard from counts as listening.
	peerTTL = time.Minute
	// helloEvery keeps an idle node known to its peers.
	helloEvery = peerTTL / 3
	// selfTTL is how long a node's own hello counts as proof that its
	// listener hears: two hellos missed and it is not alone any more.
	selfTTL = 2*helloEvery + 5*time.Second
	// silence ends a listener that heard nothing, not even its own
	// hellos: its connection is taken for dead and opened again.
	silence = selfTTL
	// helloPrefix marks a node's hello; nodes before it take a hello for
	// a commit's wake-up, which is harmless.
	helloPrefix = "hello/"
	// byePrefix marks a node's goodbye (its listener's end as it stops
	// running, or its Close): the others stop counting it in the timer
	// share at once. Nodes before it take it for a commit's wake-up.
	byePrefix = "bye/"
	// hiPrefix marks a listening node's wake-up for everything: it runs
	// (see timerShare). Nodes before it take it for any wake-up.
	hiPrefix = "hi/"
	// namedMark follows the node id of a hello or a hi (as "?L"): the
	// node's own check found its listener under its name (listenerName),
	// so the others may drop the node once that connection is gone
	// (dropGonePeers). Nodes before it skip it in a hello, and in a hi
	// take it for a notification that says nothing they can read, which
	// wakes them for everything, as a hi does (decodeReady must never
	// accept it).
	namedMark = "L"
	// helloSQL is the listener's first hello, after LISTEN.
	helloSQL = "SELECT pg_notify($1, '" + helloPrefix + "' || $2)"
)

// notify sends payload and reports whether it went out.
func (s *Store) notify(payload string) bool { return s.notifyWithin(payload, 5*time.Second) }

// notifyWithin is notify giving up after d.
func (s *Store) notifyWithin(payload string, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if _, err := s.DB().ExecContext(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		s.Log().Warn("postgres notify failed; other nodes wake at their next sweep or this node's next notification", "err", err)
		return false
	}
	return true
}

// present sends payload, a hello or a hi, unless this node said goodbye
// since a listener last started or none is up; then it sends instead (if
// not empty), what wakes the others without counting this node. False:
// it failed to go out.
func (s *Store) present(payload, instead string) bool {
	s.sayMu.Lock()
	defer s.sayMu.Unlock()
	// Nor while no listener is up: a publisher that saw one up may come
	// here after it ended and its goodbye failed to go out.
	if s.gone || !s.listening.Load() {
		return instead == "" || s.notify(instead)
	}
	if !s.notify(payload) {
		return false
	}
	s.helloed.Store(true) // the others may count it now: it says goodbye
	return true
}

// goodbye tells the others that this node stops firing timers (its
// listener ended as the node stopped running, or the store closes): they
// take its share at once. Once a listener's start. run is the Wakeups
// call whose end it is (0: the store closes), which has no goodbye to
// say if another has begun since.
func (s *Store) goodbye(run int64) {
	s.sayMu.Lock()
	defer s.sayMu.Unlock()
	if run == 0 {
		s.closed = true
	}
	if s.gone || !s.helloed.Load() || (run != 0 && run != s.run) {
		return
	}
	// Within goodbyeWait: a server shutting down waits for it. One that
	// did not go out is tried again at Close (no listener runs meanwhile,
	// so no hello goes out either).
	s.gone = s.notifyWithin(byePrefix+s.node+":"+s.scope, goodbyeWait)
}

// goodbyeWait bounds a goodbye's NOTIFY: a node stopping must not wait
// long for a database it cannot reach (the others then drop it at their
// check of its listener, or after peerTTL).
const goodbyeWait = 2 * time.Second

// hello is this node's hello.
func (s *Store) hello() string {
	return helloPrefix + s.node + s.mark() + ":" + s.scope
}

// mark is what follows this node's id in its hellos and hi's: namedMark
// while Postgres shows its listener under its name (checked as the
// listener starts and at each check of the peers: a pooler that renames
// connections would have the others drop it at every check and count it
// again at every notification).
func (s *Store) mark() string {
	if s.named.Load() {
		return "?" + namedMark
	}
	return ""
}

// alone: this node listens, its own hellos come back, and it has heard no
// other node of its scope for peerTTL.
func (s *Store) alone() bool {
	t := s.since()
	return s.listening.Load() && t-s.heard.Load() > int64(peerTTL) && t-s.self.Load() <= int64(selfTTL)
}

func (s *Store) since() int64 { return int64(s.now().Sub(s.base)) }

// heardPeer records a notification from another node of this scope and
// wakes the others when it was a hello or this node had been alone (see
// publish). heard is set first: the wake-up is sent only if the node is
// not alone when publish takes it.
func (s *Store) heardPeer(hello bool) {
	was := s.alone()
	s.heard.Store(s.since())
	if was || hello {
		s.everything.Store(true)
		select {
		case s.pub <- struct{}{}:
		default:
		}
	}
}

// share is this node's place among the nodes it knows of: the index of
// its id among all their ids in order, and how many there are.
type share struct {
	index, of int
	at        int64 // when computed (since base)
}

// peer is another node of this scope heard from.
type peer struct {
	at    int64 // when last heard from (since base)
	named bool  // its last hello or hi said its listener is named (namedMark)
}

// shareEvery is how long a computed timer share is used: nodes that go
// quiet leave it only after peerTTL anyway.
const shareEvery = time.Second

// heardFrom records another node's hello, or its wake-up for everything
// while it listens: a node not counted in the timer share yet is counted
// at the next read of due timers. named: the hello or hi said the node's
// listener is named for it.
func (s *Store) heardFrom(node string, named bool) {
	s.peersMu.Lock()
	p, known := s.peers[node]
	if !known {
		p = &peer{}
		s.peers[node] = p
		s.share.Store(nil)
	}
	p.at = s.since()
	p.named = named
	s.peersMu.Unlock()
	if !known {
		s.Log().Info("postgres node joined the timer share", "node", node)
	}
}

// left forgets a node that said goodbye.
func (s *Store) left(node string) {
	if s.forget(func(id string, _ *peer) bool { return id == node }) > 0 {
		s.Log().Info("postgres node left the timer share: it said goodbye", "node", node)
	}
}

// forget takes the nodes gone says are gone out of the timer share, and
// wakes this node's timer loop if there were any: part of their share is
// this node's now. gone is called under peersMu. It returns how many.
func (s *Store) forget(gone func(id string, p *peer) bool) int {
	s.peersMu.Lock()
	var n int
	for id, p := range s.peers {
		if gone(id, p) {
			delete(s.peers, id)
			n++
		}
	}
	if n > 0 {
		s.share.Store(nil)
	}
	s.peersMu.Unlock()
	if n > 0 {
		s.shareChanged()
	}
	return n
}

// listenerPrefix starts the application_name of a node's LISTEN
// connection: the node's id follows, then a space and the name the
// database URL gave, if any (Postgres keeps the first 63 bytes). The
// other nodes look for it in pg_stat_activity (see dropGonePeers), and an
// operator sees which connection is which node's listener.
const listenerPrefix = "ferry listener "

// listenerName is the application_name of node's LISTEN connection, app
// being the one its database URL sets.
func listenerName(node, app string) string {
	if app == "" {
		return listenerPrefix + node
	}
	return listenerPrefix + node + " " + app
}

// listenerID is the node id in a listener's application_name.
func listenerID(app string) (string, bool) {
	rest, ok := strings.CutPrefix(app, listenerPrefix)
	id, _, _ := strings.Cut(rest, " ")
	return id, ok && id != ""
}

// peerCheckEvery is how often a listening node with peers checks that
// their listeners are still connected; peerCheckTimeout bounds a check.
const (
	peerCheckEvery   = time.Second
	peerCheckTimeout = 5 * time.Second
)

// dropGonePeers takes out of the timer share the nodes whose LISTEN
// connection Postgres no longer has. A node whose process ended (a
// crash, a kill) has no goodbye to send, but its connections close with
// it and Postgres ends their backends at once; without this check its
// share of the timers would be fired TimerShareGrace late until peerTTL
// had passed since its last hello. Only a node whose last hello or hi
// said its listener is named (namedMark) is dropped: a node of a version
// before this one leaves after peerTTL, as before (dropping it at every
// check, to count it again at its next notification, would have both
// nodes fire its share). Nor does a check that cannot find this node's own listener
// drop anyone (a pooler that renames connections): it fails instead. A
// node heard from since the check began is kept (a listener that
// reconnected says hello again), and a failed check drops no one:
// peerTTL still bounds a node that vanished without its connections
// closing (its machine gone), which Postgres notices only through TCP
// keepalives.
func (s *Store) dropGonePeers(ctx context.Context) error {
	start := s.since()
	s.peersMu.Lock()
	n := len(s.peers)
	s.peersMu.Unlock()
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, peerCheckTimeout)
	defer cancel()
	rows, err := s.ReadDB().QueryContext(ctx, "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE '"+listenerPrefix+"%'")
	if err != nil {
		return fmt.Errorf("postgres: check peers: %w", err)
	}
	defer rows.Close()
	alive := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return fmt.Errorf("postgres: check peers: %w", err)
		}
		if id, ok := listenerID(name); ok {
			alive[id] = true
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("postgres: check peers: %w", err)
	}
	if !alive[s.node] {
		s.named.Store(false)
		return fmt.Errorf("postgres: check peers: this node's own listener (application_name %q) is not in pg_stat_activity", listenerPrefix+s.node)
	}
	if !s.named.Swap(true) {
		// The others learn it at once, not at the next hello.
		s.present(s.hello(), "")
	}
	var gone []string
	s.forget(func(id string, p *peer) bool {
		if !p.named || alive[id] || p.at >= start {
			return false
		}
		gone = append(gone, id)
		return true
	})
	for _, id := range gone {
		s.Log().Info("postgres node gone: its listener disconnected; its share of the timers is the others' now", "node", id)
	}
	return nil
}

// watchPeers runs dropGonePeers every peerCheckEvery until ctx ends. It
// warns when checks begin to fail, not at each one (a database that
// refuses the check would log every second), and says when they work
// again.
func (s *Store) watchPeers(ctx context.Context) {
	tick := time.NewTicker(peerCheckEvery)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			err := s.dropGonePeers(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil && !failing:
				s.Log().Warn("postgres peer check failed; a node that died without a goodbye leaves the timer share only after a minute", "err", err)
			case err == nil && failing:
				s.Log().Info("postgres peer check works again")
			}
			failing = err != nil
		}
	}
}

// shareChanged wakes this node's timer loop to read again: timers another
// node's share held back, not yet overdue at its last read, may be this
// node's now, and the loop's plan (when the next is due) did not count
// them.
func (s *Store) shareChanged() {
	if fn := s.local.Load(); fn != nil {
		(*fn)(store.Committed{TimerDue: s.now()})
	}
}

// timerShare is this node's share of the due timers (see
// sqlstore.Store.ShareTimers): the nodes are this one and those whose
// hello (or wake-up for everything while it listens, hiPrefix) it heard
// within peerTTL, ordered by id. Only those count: a node says hello when
// its listener starts and every helloEvery, and listens only while it
// runs (its timer loop with it), while a process that only writes (an
// engine opened without Run) notifies its commits and must own no share.
// A newcomer counts for the others at its hello, and they for it at
// their answers to it; a node that stops running (its listener ends with
// Run's context) or closes says goodbye and leaves the share at once, one
// whose process ended leaves it at the others' next
// check of its listener (dropGonePeers), and one that vanished without
// its connections closing counts until peerTTL has passed: its share is
// fired late by TimerShareGrace meanwhile.
func (s *Store) timerShare() (index, of int) {
	now := s.since()
	if sh := s.share.Load(); sh != nil && now-sh.at < int64(shareEvery) {
		return sh.index, sh.of
	}
	// Stored under the lock: a node heard meanwhile resets what is
	// stored after this.
	s.peersMu.Lock()
	ids := []string{s.node}
	var unheard []string
	for id, p := range s.peers {
		if now-p.at > int64(peerTTL) {
			delete(s.peers, id)
			unheard = append(unheard, id)
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	sh := &share{index: slices.Index(ids, s.node), of: len(ids), at: now}
	s.share.Store(sh)
	last := s.lastShare
	s.lastShare = sh
	s.peersMu.Unlock()
	for _, id := range unheard {
		s.Log().Info("postgres node left the timer share: not heard from for a minute", "node", id)
	}
	if last != nil && (last.index != sh.index || last.of != sh.of) {
		s.shareChanged()
	}
	return sh.index, sh.of
}

// Close stops the publisher, says goodbye to the other nodes unless this
// node did when it stopped running, ends its listener and closes the
// pools.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		s.pubDone.Wait()
		// Said when the node stopped running, unless it closes while it
		// runs (or it never stopped).
		s.goodbye(0)
		err = s.Store.Close()
	})
	return err
}

// DefaultMaxConns bounds a server's connections unless the URL sets
// ferry_max_conns; 32 measured ≈15 % faster than 16 on two cores.
const DefaultMaxConns = 32

// ServerURL is dsn without the parameters only Ferry reads
// (ferry_max_conns): what Postgres itself accepts, for tools that connect
// with the URL Ferry is given.
func ServerURL(dsn string) (string, error) {
	dsn, _, err := takeMaxConns(dsn)
	return dsn, err
}

func takeMaxConns(dsn string) (string, int, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", 0, fmt.Errorf("postgres: %w", urlError(err))
	}
	q := u.Query()
	if len(q["ferry_max_conns"]) > 1 {
		// Which one was meant is not for Ferry to guess (the second was
		// silently ignored).
		return "", 0, fmt.Errorf("postgres: ferry_max_conns is given %d times; give it once", len(q["ferry_max_conns"]))
	}
	v := q.Get("ferry_max_conns")
	if v == "" {
		return dsn, DefaultMaxConns, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 2 || n > 1000 {
		return "", 0, fmt.Errorf("postgres: ferry_max_conns=%q must be a whole number from 2 to 1000", v)
	}
	q.Del("ferry_max_conns")
	u.RawQuery = q.Encode()
	return u.String(), n, nil
}

// urlError is what a database URL that does not parse says in errors
// and logs: url.Parse's error quotes the whole URL, password and all, and
// an invalid escape quotes the part of it at fault, which is often in the
// password.
func urlError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ee url.EscapeError
	if errors.As(err, &ee) {
		return errors.New("the database URL has an invalid %-escape: percent-encode the special characters of its user name and password (% as %25, @ as %40, / as %2F)")
	}
	return fmt.Errorf("the database URL does not parse: %w", err)
}

// Refused tells whether err is Postgres refusing the data a write
// carries rather than failing: a data exception (class 22: bytes that are
// not UTF-8, NUL in text, a value out of range) or a program limit
// (class 54: an index entry too large). The runtime then writes a batch
// again one request at a time, so the request at fault fails alone.
func (s *Store) Refused(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "54"))
}

func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// Wakeups listens for NOTIFY on a dedicated connection, reconnecting after
// failures; a missed notification only delays work until the dispatcher's
// safety-net sweep. When ctx ends the node says goodbye (see goodbye).
func (s *Store) Wakeups(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	s.sayMu.Lock()
	s.run++
	run := s.run
	s.sayMu.Unlock()
	s.listenFailing.Store(false)
	// A closed store listens no more: its goodbye is said.
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	go func() {
		defer close(ch)
		defer cancel()
		for ctx.Err() == nil {
			var up time.Time // when this listener said hello
			if err := s.listen(ctx, ch, &up); err != nil && ctx.Err() == nil {
				if !up.IsZero() && time.Since(up) >= s.listenUp {
					// A connection that was up broke: connect again at
					// once, so that the others' check of the listeners
					// (each second) is unlikely to find this node gone,
					// and both fire its share meanwhile. (Not one that
					// broke within listenUp: that could loop.)
					s.Log().Warn("postgres listener's connection ended; reconnecting", "err", err)
					continue
				}
				// Once per outage, not every second of it (see listen).
				if !s.listenFailing.Swap(true) {
					s.Log().Warn("postgres listen failed; retrying every second", "err", err)
				} else {
					s.Log().Debug("postgres listen failed again", "err", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(s.listenRetry):
				}
			}
		}
		// The node stops running (its timer loop with its listener): the
		// others take its share now, not at its Close, which may come
		// seconds later (a server finishing its requests) or never.
		s.goodbye(run)
	}()
	return ch
}

func (s *Store) listen(ctx context.Context, ch chan<- struct{}, up *time.Time) error {
	cfg, err := pgx.ParseConfig(s.dsn)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = listenerName(s.node, cfg.RuntimeParams["application_name"])
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		// Bounded: Run waits for the listener's end (and its goodbye).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		return err
	}
	// Whether Postgres shows this connection under its name (a pooler may
	// rename it): the hello says so (mark), and the others may then drop
	// this node once the connection is gone. Known before the node counts
	// as listening, so that no hi goes out with the last connection's
	// answer; a failed look says no, and the node listens all the same.
	var app string
	named := conn.QueryRow(ctx, "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()").Scan(&app) == nil
	id, ok := listenerID(app)
	s.named.Store(named && ok && id == s.node)
	s.listening.Store(true)
	defer s.listening.Store(false)
	// The hello goes on this connection: it is sent once LISTEN is in
	// force, and a failure to send it ends the listener like any other.
	// It ends a goodbye said when the node last stopped running. helloed
	// is set before it is sent: one that reached the others unanswered
	// (ctx ended) still has its goodbye said.
	s.sayMu.Lock()
	if s.closed {
		s.sayMu.Unlock()
		return errors.New("postgres: store closed")
	}
	s.gone = false
	s.helloed.Store(true)
	hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = conn.Exec(hctx, helloSQL, channel, strings.TrimPrefix(s.hello(), helloPrefix))
	hcancel()
	s.sayMu.Unlock()
	if err != nil {
		return err
	}
	*up = time.Now()
	s.listens.Add(1)
	s.said.Store(true)
	defer s.said.Store(false)
	if s.listenFailing.Swap(false) {
		s.Log().Info("postgres listener connected again")
	}
	pctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watchPeers(pctx)
	}()
	defer func() {
		stopWatch()
		<-watched
	}()
	for {
		wctx, cancel := context.WithTimeout(ctx, silence)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("no notification for %s, not even this node's own hello", silence)
			}
			return err
		}
		payload, hello := strings.CutPrefix(n.Payload, helloPrefix)
		payload, hi := strings.CutPrefix(payload, hiPrefix)
		payload, bye := strings.CutPrefix(payload, byePrefix)
		node, scope, _ := strings.Cut(payload, ":") // a node id has no ':'
		if scope != s.scope {
			continue // another deployment's
		}
		// What the commits made ready follows the id (nodes before that
		// sent the id alone, and take this id for another node's).
		node, info, told := strings.Cut(node, "?")
		if node == s.node {
			if hello {
				s.self.Store(s.since()) // this listener hears
			}
			continue // this node woke itself already
		}
		if bye {
			s.left(node)
			continue
		}
		s.heardPeer(hello)
		if hello || hi {
			s.heardFrom(node, info == namedMark)
		}
		if hello {
			continue // a node saying it is there, not work
		}
		if hi && info == namedMark {
			told = false // a wake-up for everything
		}
		// (Without a commit hook, what it says reaches no one: Wakeups
		// wakes for everything instead.)
		if told && s.local.Load() != nil {
			if ready, err := decodeReady(info); err == nil {
				s.peerCommitted(ready)
				continue
			}
		}
		// Its tasks may be of types this node has not seen pending.
		s.Store.PendingTypesChanged()
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// peerCommitted wakes what another node's commits made ready, as this
// node's own commits do.
func (s *Store) peerCommitted(ready peerReady) {
	if ready.tasks {
		if ready.types == nil {
			s.Store.PendingTypesChanged()
		} else {
			s.Store.PendingTypesAdded(ready.types)
		}
	}
	if fn := s.local.Load(); fn != nil {
		c := store.Committed{Tasks: ready.tasks, Types: ready.types, HTTPDue: ready.http, TimerDue: ready.timer}
		if ready.tasks && !ready.tasksNow {
			c.TasksAt = ready.tasksAt
		}
		(*fn)(c)
	}
}

// TimerShare is this node's share of the due timers: its place among the
// nodes it counts (itself included) and how many they are (see
// timerShare).
func (s *Store) TimerShare() (index, of int) { return s.timerShare() }

// Listening reports whether this node's LISTEN connection is up and has
// said hello on it: notifications reach the node, and the other nodes
// know of it.
func (s *Store) Listening() bool { return s.said.Load() }

// DB exposes the pool for tests.
func (s *Store) DB() *sql.DB { return s.Store.DB() }
