// Package testwait is how tests wait for something another goroutine or
// process does: they poll a condition under a deadline, never sleep for a
// guessed while. It imports only the standard library; production code
// must not import it.
package testwait
