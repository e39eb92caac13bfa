package storetest

import (
	"testing"

	"github.com/ferryhq/ferry/internal/store"
)

var apiKeyTests = []test{
	{"AddHasExists", testAPIKeys},
}

func testAPIKeys(t *testing.T, s store.Store) {
	ctx := t.Context()
	has, err := s.HasAPIKeys(ctx)
	must(t, err, "HasAPIKeys")
	if has {
		t.Error("HasAPIKeys = true on an empty store")
	}
	const h1 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	const h2 = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
	exists, err := s.APIKeyExists(ctx, h1)
	must(t, err, "APIKeyExists")
	if exists {
		t.Error("APIKeyExists = true on an empty store")
	}

	must(t, s.AddAPIKey(ctx, "ci", h1), "AddAPIKey")
	has, err = s.HasAPIKeys(ctx)
	must(t, err, "HasAPIKeys")
	if !has {
		t.Error("HasAPIKeys = false after AddAPIKey")
	}
	exists, err = s.APIKeyExists(ctx, h1)
	must(t, err, "APIKeyExists")
	if !exists {
		t.Error("APIKeyExists(added) = false")
	}
	exists, err = s.APIKeyExists(ctx, h2)
	must(t, err, "APIKeyExists")
	if exists {
		t.Error("APIKeyExists(other hash) = true")
	}
	exists, err = s.APIKeyExists(ctx, "")
	must(t, err, "APIKeyExists(empty)")
	if exists {
		t.Error(`APIKeyExists("") = true`)
	}

	// Adding the same hash again, under any name, is not an error.
	must(t, s.AddAPIKey(ctx, "ci", h1), "AddAPIKey same hash")
	must(t, s.AddAPIKey(ctx, "renamed", h1), "AddAPIKey same hash, other name")
	exists, err = s.APIKeyExists(ctx, h1)
	must(t, err, "APIKeyExists")
	if !exists {
		t.Error("APIKeyExists = false after re-adding")
	}

	must(t, s.AddAPIKey(ctx, "second", h2), "AddAPIKey second")
	exists, err = s.APIKeyExists(ctx, h2)
	must(t, err, "APIKeyExists")
	if !exists {
		t.Error("APIKeyExists(second) = false")
	}
}
