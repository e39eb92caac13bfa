package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry"
)

func serverCmd() *cobra.Command {
	var (
		listen, database, publicURL, egress string
		migrate                             bool
		lease, tick                         time.Duration
		logLevel                            string
		maxDefBytes, maxSteps               int
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the Ferry server (API, webhook callbacks and the dispatcher)",
		Long: `Run the Ferry server on the embedded SQLite file (default) or Postgres.

On first start without FERRY_API_KEY it creates an admin API key and prints
it once; only its hash is stored.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lvl}))
			switch {
			case lease <= 0:
				return fmt.Errorf("--lease must be a positive duration, like 30s")
			case tick <= 0:
				return fmt.Errorf("--safety-tick must be a positive duration, like 5s")
			case maxDefBytes <= 0:
				return fmt.Errorf("--max-definition-bytes must be positive")
			case maxSteps <= 0:
				return fmt.Errorf("--max-steps must be positive")
			}
			if publicURL != "" {
				if u, err := url.Parse(publicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					return fmt.Errorf("--public-url %q: want an absolute http or https URL, like https://ferry.example.com", publicURL)
				} else if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(publicURL, "#") {
					// Callback paths (/wh/<token>) are appended to it: after a
					// query or fragment they would not be paths at all.
					return fmt.Errorf("--public-url %q: want a URL without a query or fragment (callback paths are appended to it)", publicURL)
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The port is bound once the engine is open (connections are
			// refused, not left waiting, through migrations and warm-up),
			// unless the default public URL needs the address bound first:
			// a port 0 (the kernel picks it) or no host.
			var ln net.Listener
			bind := func() error {
				var err error
				if ln, err = net.Listen("tcp", listen); err != nil {
					return fmt.Errorf("listen on %s: %w", listen, err)
				}
				return nil
			}
			defer func() {
				if ln != nil {
					ln.Close()
				}
			}()
			if publicURL == "" {
				host, port, err := net.SplitHostPort(listen)
				if ip := net.ParseIP(host); err != nil || port == "0" || host == "" || (ip != nil && ip.IsUnspecified()) {
					if err := bind(); err != nil {
						return err
					}
					publicURL = defaultPublicURL(ln.Addr(), log)
				} else {
					publicURL = "http://" + listen
				}
			}
			tp, stopTracing, err := ferry.TracerProviderFromEnv(ctx, "")
			if err != nil {
				return err
			}
			// Deferred first, so run last: after the engine's Close, the
			// spans its last commits made are flushed.
			defer func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if err := stopTracing(sctx); err != nil {
					log.Warn("flushing spans at stop failed", "err", err)
				}
			}()
			eng, err := ferry.Open(ctx, ferry.Config{
				Database: database, PublicURL: publicURL, EgressAllow: egress,
				Migrate: migrate, Lease: lease, SafetyTick: tick, Logger: log,
				MaxDefinitionBytes: maxDefBytes, MaxSteps: maxSteps,
				TracerProvider: tp,
			})
			if err != nil {
				return err
			}
			defer eng.Close()
			key, err := eng.EnsureAPIKey(ctx, os.Getenv("FERRY_API_KEY"))
			if err != nil {
				return fmt.Errorf("api key: %w", err)
			}
			if key != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "Created admin API key (shown once, store it now):\n\n  FERRY_API_KEY=%s\n\n", key)
			}
			if ln == nil {
				if err := bind(); err != nil {
					return err
				}
			}
			// IdleTimeout closes a keep-alive connection its client left
			// (a worker that died without closing it); longer than the Go
			// client's own 90 s, so that a client normally closes first
			// and never sends on a connection the server is closing.
			srv := &http.Server{Handler: eng.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
			// Shutdown waits for requests in flight; end workers' long-polls.
			srv.RegisterOnShutdown(eng.Drain)
			runDone := make(chan error, 1)
			go func() { runDone <- eng.Run(ctx) }()
			srvDone := make(chan error, 1)
			go func() { srvDone <- srv.Serve(ln) }()
			fmt.Fprintf(cmd.OutOrStdout(), "ferry listening on http://%s (database %s)\n", ln.Addr(), redact(database))
			select {
			case <-ctx.Done():
			case err := <-srvDone:
				stop()
				return err
			}
			// A second signal now ends the process at once, as a signal
			// does by default.
			stop()
			shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			var shutErr error
			if err := srv.Shutdown(shutCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Warn("http shutdown", "err", err)
				shutErr = fmt.Errorf("shutdown: requests still in flight after 10s: %w", err)
			}
			return errors.Join(<-runDone, shutErr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", envOr("FERRY_LISTEN", "127.0.0.1:8080"), "address to listen on (FERRY_LISTEN)")
	f.StringVar(&database, "database", envOr("FERRY_DATABASE", ferry.DefaultDatabase), "sqlite:PATH or postgres:// URL (FERRY_DATABASE)")
	hideDefaultPassword(cmd)
	f.StringVar(&publicURL, "public-url", envOr("FERRY_PUBLIC_URL", ""), "base URL for webhook callbacks (FERRY_PUBLIC_URL; default http:// and the address bound)")
	f.StringVar(&egress, "egress-allow", envOr("FERRY_EGRESS_ALLOW", ""), "CIDRs and host names HTTP steps may reach besides public addresses (FERRY_EGRESS_ALLOW)")
	f.BoolVar(&migrate, "migrate", true, "apply pending database migrations at start")
	f.DurationVar(&lease, "lease", 30*time.Second, "how long claimed work is held before another node may take it over")
	f.DurationVar(&tick, "safety-tick", 5*time.Second, "longest dispatcher sleep without a wake-up")
	f.IntVar(&maxDefBytes, "max-definition-bytes", 256<<10, "largest accepted workflow definition")
	f.IntVar(&maxSteps, "max-steps", 100, "most steps in one workflow")
	f.StringVar(&logLevel, "log-level", envOr("FERRY_LOG_LEVEL", "info"), "debug, info, warn or error (FERRY_LOG_LEVEL)")
	return cmd
}

func migrateCmd() *cobra.Command {
	var database string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending database migrations",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ferry.Migrate(cmd.Context(), database); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "migrations applied")
			return nil
		},
	}
	cmd.Flags().StringVar(&database, "database", envOr("FERRY_DATABASE", ferry.DefaultDatabase), "sqlite:PATH or postgres:// URL (FERRY_DATABASE)")
	hideDefaultPassword(cmd)
	return cmd
}

// hideDefaultPassword keeps the password of a FERRY_DATABASE URL out of
// --help, which shows the flag's default: help output is pasted into
// issues and chats, and the password stays out of errors and logs too.
func hideDefaultPassword(cmd *cobra.Command) {
	f := cmd.Flags().Lookup("database")
	f.DefValue = redact(f.DefValue)
}

// redact hides a Postgres password in logs and help: the URL's own, and
// a password parameter (libpq's ?password=). A setting that is neither a
// SQLite path nor a URL that parses (a password whose % is not encoded, a
// key=value connection string) is not shown at all: where its password
// is cannot be told.
func redact(db string) string {
	if strings.HasPrefix(db, "sqlite:") {
		return db
	}
	u, err := url.Parse(db)
	if err != nil || u.Scheme == "" {
		return "(not shown: not a URL, so its password cannot be hidden)"
	}
	changed := false
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			changed = true
		}
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
		changed = true
	}
	if !changed {
		return db
	}
	return u.String()
}

// defaultPublicURL is http:// and the address bound. An unspecified host
// (0.0.0.0, ::, a listen address with no host) is no address a caller can
// use: loopback stands in, with a warning that callbacks from elsewhere
// need --public-url.
func defaultPublicURL(addr net.Addr, log *slog.Logger) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		log.Warn("listening on every address: webhook callback URLs use 127.0.0.1; set --public-url for callers on other machines", "listen", addr.String())
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
