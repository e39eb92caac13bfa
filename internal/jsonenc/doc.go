// Package jsonenc writes the small JSON objects Ferry encodes on every
// step, byte for byte as encoding/json does, without its reflection:
// event data in the store, a handler's result in the worker SDK. A map
// of strings, integers and times took encoding/json a tenth of Ferry's
// CPU in the jobs benchmark (it sorts the keys and reflects on every
// value). Anything else goes to encoding/json.
//
// It imports only the standard library.
package jsonenc
