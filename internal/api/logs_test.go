package api

import (
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
)

func TestLogsRequestValidate(t *testing.T) {
	r := LogsRequest{}
	if err := r.Validate(); err != nil || r.Source != LogSourceInit || r.IdleSec != DefaultLogIdleSec {
		t.Fatalf("defaults: %+v, %v", r, err)
	}
	for _, bad := range []LogsRequest{
		{Source: "kernel"}, {Tail: -1}, {Tail: MaxLogTailLines + 1}, {IdleSec: -1}, {IdleSec: MaxLogIdleSec + 1},
	} {
		if err := bad.Validate(); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("%+v: %v, want invalid_argument", bad, err)
		}
	}
}
