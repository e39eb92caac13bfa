// Package ferrytest starts a real Ferry engine behind an httptest server for
// tests in other packages (client, cli, api, e2e). It imports package ferry
// and the standard library; production code must not import it.
package ferrytest
