package runtime

import (
	"strconv"

	"github.com/ferryhq/ferry/internal/jsonenc"
	"github.com/ferryhq/ferry/internal/status"
)

// The data of a step's most frequent events, and a task step's request,
// encoded here rather than as maps for the store to encode: each map, its
// boxed values and their encoding were a tenth of the objects a chain10
// step allocated. The output is json.Marshal's of the map, byte for byte
// (keys sorted; strings as jsonenc writes them, which is encoding/json's).

// taskRef is {"task_id": id, "type": typ}.
func taskRef(id, typ string) []byte {
	b := make([]byte, 0, len(`{"task_id":"","type":""}`)+len(id)+len(typ))
	b = append(b, `{"task_id":`...)
	b = jsonenc.AppendString(b, id)
	b = append(b, `,"type":`...)
	b = jsonenc.AppendString(b, typ)
	return append(b, '}')
}

// attemptRef is {"task_id": id, "attempt": attempt}.
func attemptRef(attempt int, id string) []byte {
	b := make([]byte, 0, len(`{"attempt":,"task_id":""}`)+20+len(id))
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, int64(attempt), 10)
	b = append(b, `,"task_id":`...)
	b = jsonenc.AppendString(b, id)
	return append(b, '}')
}

// taskEndedData is {"attempt": attempt, "error": msg}, without "error" when
// msg is empty: the data of a task's last event.
func taskEndedData(attempt int, msg string) []byte {
	b := make([]byte, 0, len(`{"attempt":,"error":""}`)+20+len(msg))
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, int64(attempt), 10)
	if msg != "" {
		b = append(b, `,"error":`...)
		b = jsonenc.AppendString(b, msg)
	}
	return append(b, '}')
}

// runStartedData is {"workflow": name, "version": version}, the data of a
// run's first event.
func runStartedData(name string, version int) []byte {
	b := make([]byte, 0, len(`{"version":,"workflow":""}`)+20+len(name))
	b = append(b, `{"version":`...)
	b = strconv.AppendInt(b, int64(version), 10)
	b = append(b, `,"workflow":`...)
	b = jsonenc.AppendString(b, name)
	return append(b, '}')
}

// runEndedData is {"status": status, "reason": reason}, the data of a
// run's last event.
func runEndedData(status, reason string) []byte {
	b := make([]byte, 0, len(`{"reason":"","status":""}`)+len(reason)+len(status))
	b = append(b, `{"reason":`...)
	b = jsonenc.AppendString(b, reason)
	b = append(b, `,"status":`...)
	b = jsonenc.AppendString(b, status)
	return append(b, '}')
}

// runEndedType is the type of a run's last event: "run_" and its status,
// without building the string for each run.
func runEndedType(s string) string {
	switch s {
	case status.RunCompleted:
		return "run_" + status.RunCompleted
	case status.RunFailed:
		return "run_" + status.RunFailed
	case status.RunCancelled:
		return "run_" + status.RunCancelled
	case status.RunTimeout:
		return "run_" + status.RunTimeout
	}
	return "run_" + s
}
