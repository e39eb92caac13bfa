package spec

import (
	"errors"
	"testing"
)

// TestDuplicateKeysRefused: a key given twice in one object of a JSON
// definition is refused, naming it, as YAML refuses one; JSON would keep
// the last without a word (a second "tasks" dropped the first's steps).
// (Found by an audit.)
func TestDuplicateKeysRefused(t *testing.T) {
	for doc, path := range map[string]string{
		`{"name":"a","tasks":{"x":{"url":"https://a.com"}},"tasks":{"y":{"sleep":1}}}`:       "tasks",
		`{"name":"a","tasks":{"x":{"sleep":1,"sleep":2}}}`:                                   "tasks.x.sleep",
		`{"name":"a","tasks":{"x":{"url":"https://a.com","body":{"k":[{"a":1,"a":2}]}}}}`:    "tasks.x.body.k[0].a",
		`{"name":"a","tasks":{"x":{"url":"https://a.com","body":[1,{"b":{},"c":2,"b":3}]}}}`: "tasks.x.body[1].b",
		`{"name":"a","name":"b","tasks":{"x":{"sleep":1}}}`:                                  "name",
	} {
		_, err := Parse([]byte(doc), DefaultLimits)
		var ve *ValidationError
		if !errors.As(err, &ve) || len(ve.Errors) == 0 || ve.Errors[0].Code != CodeDuplicateKey || ve.Errors[0].Path != path {
			t.Errorf("%s: %v, want duplicate_key at %s", doc, err, path)
		}
	}
	// Equal keys in different objects are not duplicates.
	if _, err := Parse([]byte(`{"name":"a","tasks":{"x":{"url":"https://a.com","body":{"a":{"a":1},"b":[{"a":1},{"a":2}]}}}}`), DefaultLimits); err != nil {
		t.Errorf("keys equal across objects: %v", err)
	}
}

// TestEveryDuplicateKeyIsTold: every key given twice is told, each once,
// beside a step given twice (told as invalid_name), as a definition's
// errors list every problem.
func TestEveryDuplicateKeyIsTold(t *testing.T) {
	doc := `{"name":"a","tasks":{"x":{"sleep":1},"x":{"sleep":2,"sleep":3,"sleep":4}},"name":"b","enabled":true,"enabled":false}`
	_, err := Parse([]byte(doc), DefaultLimits)
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("%v", err)
	}
	got := map[string]string{}
	for _, e := range ve.Errors {
		got[e.Path] += e.Code + " "
	}
	want := map[string]string{"tasks.x": "invalid_name ", "tasks.x.sleep": "duplicate_key ", "name": "duplicate_key ", "enabled": "duplicate_key "}
	for p, c := range want {
		if got[p] != c {
			t.Errorf("%s: %q, want %q (all: %v)", p, got[p], c, got)
		}
	}
}
