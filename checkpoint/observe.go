package checkpoint

import (
	"context"
	"time"
)

// ObservationKind says what an Observation reports.
type ObservationKind string

// The kinds of Observation Run reports to Options.Observe.
const (
	// ObservedStart: Run read the task's newest checkpoint and is about
	// to call fn; Resumed reports that it resumes from a checkpoint
	// (whose Progress is given), rather than starting afresh.
	ObservedStart ObservationKind = "start"
	// ObservedSave: a Cursor.Save (or SaveETA) ended; Err is nil when the
	// checkpoint was stored, an error matching ErrStale when it was
	// refused, or another error. Progress is the save's, Duration how
	// long it took.
	ObservedSave ObservationKind = "save"
)

// Observation is one thing Run did, reported to Options.Observe for
// telemetry: package otelwarden turns observations into OpenTelemetry
// metrics. Fields that do not apply to the Kind are zero.
type Observation struct {
	Kind   ObservationKind
	TaskID string
	// Resumed reports a run that resumes from a checkpoint
	// (ObservedStart).
	Resumed bool
	// Progress is the resumed checkpoint's (ObservedStart) or the save's
	// (ObservedSave), 0–100.
	Progress float64
	// Duration is how long the save took (ObservedSave).
	Duration time.Duration
	// Err is the save's error (ObservedSave).
	Err error
}

// observeSave reports a save of progress that began at start and ended
// with err.
func (c *Cursor[T]) observeSave(ctx context.Context, start time.Time, progress float64, err error) {
	c.observe(ctx, Observation{Kind: ObservedSave, TaskID: c.taskID, Progress: progress, Duration: time.Since(start), Err: err})
}
