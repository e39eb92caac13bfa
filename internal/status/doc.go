// Package status holds the run and step status vocabulary shared by the
// engine, the store and the API. It imports nothing.
package status
