// Package clock is the injectable time source for timers, leases and
// retries. Production uses Real; tests can supply their own. It imports only
// the standard library.
package clock
