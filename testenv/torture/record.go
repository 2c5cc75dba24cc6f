package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Event is one line of a worker's log (JSON lines, one file per worker
// process). Times are wall-clock Unix nanoseconds: every process runs on
// the same host and reads the same clock, so times of different processes
// compare.
type Event struct {
	// Ev is the kind of event:
	//   start   the worker process started (T)
	//   wait    a goroutine called Acquire for Key (T: the call)
	//   begin   Acquire returned Lease (T: the instant it returned; Deadline:
	//           the lease's deadline then; TTL)
	//   acqfail Acquire for Key returned an error (T, Err)
	//   write   a fenced write of Lease's Token (T: sent; Result)
	//   end     Lease ended (T: the end instant, see worker.hold; How;
	//           Obs: when its context was seen done)
	//   stats   Goroutines and FDs (Phase "warm" or "end")
	//   relfail Release of Lease failed otherwise than "not held" (T, Err)
	//   openfail opening the store failed; the worker retries (T, Err)
	//   exit    the worker released everything and exits 0 (T)
	Ev         string `json:"ev"`
	T          int64  `json:"t"`
	PID        int    `json:"pid"`
	Slot       int    `json:"slot"` // the worker's place, kept across restarts
	G          int    `json:"g,omitempty"`
	Key        string `json:"key,omitempty"`
	Lease      string `json:"lease,omitempty"` // "pid-g-seq", unique in a run
	Token      int64  `json:"token,omitempty"`
	Deadline   int64  `json:"deadline,omitempty"`
	TTL        int64  `json:"ttl,omitempty"` // ns
	How        string `json:"how,omitempty"` // end: "released" or "lost"
	Obs        int64  `json:"obs,omitempty"`
	Result     string `json:"result,omitempty"` // write: "accepted", "refused" or "error"
	Err        string `json:"err,omitempty"`
	Phase      string `json:"phase,omitempty"`
	Goroutines int    `json:"goroutines,omitempty"`
	FDs        int    `json:"fds,omitempty"`
}

// Fault is one fault the orchestrator injected: a proxy mode or action on
// one worker's proxy, or a signal to one worker process, from Start to End
// (Unix ns; End == Start for instant ones: reset, sigkill).
type Fault struct {
	Kind  string // delay, blackhole, cut, reset, reset-replies, sigkill, sigstop
	Slot  int
	PID   int
	Start int64
	End   int64
}

// Process faults: what the stuck-lock check follows, and the faults under
// which overlapping leases are expected.
const (
	faultKill = "sigkill"
	faultStop = "sigstop"
)

// Write is one write the fenced resource received, in arrival order.
type Write struct {
	Key      string
	Token    int64
	Lease    string
	T        int64 // when the resource decided (Unix ns)
	Accepted bool
}

// Exit is how one worker process ended.
type Exit struct {
	Slot    int
	PID     int
	Killed  bool   // the orchestrator killed it (SIGKILL): not expected to exit cleanly
	Code    int    // exit status (-1: killed by a signal)
	Clean   bool   // its log ends with an exit event
	Stderr  string // the tail of its standard error, for the report
	Crashed bool   // it ended before the orchestrator asked it to
}

// readEvents reads a worker's log. A last line cut short (the worker was
// killed while writing it) is dropped; a worker killed before it created
// its log has none.
func readEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // a torn last line of a killed worker
		}
		evs = append(evs, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return evs, nil
}
