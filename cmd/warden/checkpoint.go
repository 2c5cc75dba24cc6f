package main

import (
	"context"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func checkpointCommands() []*command {
	return []*command{
		{
			path:     "checkpoint ls",
			readOnly: true,
			args:     "[TASK]",
			summary:  "list tasks with checkpoints, or a task's checkpoints",
			maxArgs:  1,
			help: `
Without TASK, lists the ids of the tasks that have checkpoints. With TASK,
lists its checkpoints in sequence order: id, sequence, time, progress (0–100),
estimated time remaining, the saver's fencing token and the size of the
saved state.`,
			example: `warden checkpoint ls
warden checkpoint ls import-2024`,
			setup: noFlags(checkpointLs),
		},
		{
			path:     "checkpoint show",
			readOnly: true,
			args:     "ID",
			summary:  "show one checkpoint with its saved state",
			need:     []string{"ID"},
			maxArgs:  1,
			help: `
Shows the checkpoint ID (TASK:SEQUENCE, as 'warden checkpoint ls TASK'
lists them) with its saved state (-o json: exact bytes, as text or
base64). Exits 4 if there is no such checkpoint.`,
			example: `warden checkpoint show import-2024:17`,
			setup:   noFlags(checkpointShow),
		},
		{
			path:    "checkpoint prune",
			args:    "TASK --keep N",
			summary: "delete a task's checkpoints but the newest N",
			need:    []string{"TASK"},
			maxArgs: 1,
			help: `
Deletes the checkpoints of TASK except the newest N (--keep is required;
--keep 0 deletes them all, like 'warden checkpoint rm'). Prints how many
were deleted.`,
			example: `warden checkpoint prune import-2024 --keep 3`,
			setup: func(fs *pflag.FlagSet) runFunc {
				keep := fs.Int("keep", 0, "required: how many of the newest checkpoints to keep")
				return func(ctx context.Context, c *cli, args []string) error {
					return checkpointPrune(ctx, c, args[0], *keep, fs.Changed("keep"))
				}
			},
		},
		{
			path:    "checkpoint rm",
			args:    "TASK",
			summary: "delete every checkpoint of a task",
			need:    []string{"TASK"},
			maxArgs: 1,
			help: `
Deletes every checkpoint of TASK: its next run starts from the beginning.
Exits 4 if the task has no checkpoints.`,
			example: `warden checkpoint rm import-2024`,
			setup:   noFlags(checkpointRm),
		},
	}
}

// checkpointJSON is a checkpoint's JSON form; Data and Encoding are set by
// `checkpoint show` only, DataBytes always.
type checkpointJSON struct {
	ID        string   `json:"id"`
	TaskID    string   `json:"task_id"`
	Sequence  int64    `json:"sequence"`
	Time      jsonTime `json:"time"`
	Progress  float64  `json:"progress"`
	ETAMs     int64    `json:"eta_ms"`
	Token     int64    `json:"token"`
	DataBytes int      `json:"data_bytes"`
	Data      *string  `json:"data,omitempty"`
	Encoding  string   `json:"encoding,omitempty"`
}

func toCheckpointJSON(cp driver.Checkpoint, withData bool) checkpointJSON {
	j := checkpointJSON{
		ID: cp.ID, TaskID: cp.TaskID, Sequence: cp.Sequence, Time: jsonTime(cp.Time),
		Progress: cp.Progress, ETAMs: driver.Millis(cp.ETA), Token: cp.Token, DataBytes: len(cp.Data),
	}
	if withData {
		v, enc := encodeBytes(cp.Data)
		j.Data, j.Encoding = &v, enc
	}
	return j
}

func progress(p float64) string { return strconv.FormatFloat(p, 'f', -1, 64) + "%" }

func eta(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.String()
}

func token(t int64) string {
	if t == 0 {
		return "-"
	}
	return strconv.FormatInt(t, 10)
}

func checkpointLs(ctx context.Context, c *cli, args []string) error {
	if len(args) == 0 {
		var tasks []string
		err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
			tasks, err = st.Checkpoints().Tasks(ctx, "")
			return err
		})
		if err != nil {
			return err
		}
		if c.isJSON() {
			type taskJSON struct {
				TaskID string `json:"task_id"`
			}
			out := make([]taskJSON, 0, len(tasks))
			for _, t := range tasks {
				out = append(out, taskJSON{t})
			}
			return c.printJSON(out)
		}
		tw := c.table("TASK")
		for _, t := range tasks {
			row(tw, cell(t))
		}
		return tw.Flush()
	}
	var cps []driver.Checkpoint
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		cps, err = st.Checkpoints().List(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		out := make([]checkpointJSON, 0, len(cps))
		for _, cp := range cps {
			out = append(out, toCheckpointJSON(cp, false))
		}
		return c.printJSON(out)
	}
	tw := c.table("ID", "SEQ", "TIME", "PROGRESS", "ETA", "TOKEN", "DATA")
	for _, cp := range cps {
		row(tw, cell(cp.ID), strconv.FormatInt(cp.Sequence, 10), tableTime(cp.Time), progress(cp.Progress), eta(cp.ETA), token(cp.Token), count(int64(len(cp.Data)), "byte", "bytes"))
	}
	return tw.Flush()
}

func checkpointShow(ctx context.Context, c *cli, args []string) error {
	var cp driver.Checkpoint
	var found bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		cp, found, err = st.Checkpoints().Load(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		return notFoundf("checkpoint %q not found", args[0])
	}
	if c.isJSON() {
		return c.printJSON(toCheckpointJSON(cp, true))
	}
	return c.printFields([]field{
		{"id", cell(cp.ID)},
		{"task_id", cell(cp.TaskID)},
		{"sequence", strconv.FormatInt(cp.Sequence, 10)},
		{"time", tableTime(cp.Time)},
		{"progress", progress(cp.Progress)},
		{"eta", eta(cp.ETA)},
		{"token", token(cp.Token)},
		{"data_bytes", strconv.Itoa(len(cp.Data))},
		{"data", showBytes(cp.Data)},
	})
}

func checkpointPrune(ctx context.Context, c *cli, task string, keep int, keepSet bool) error {
	cmd := findCommand("checkpoint prune")
	switch {
	case !keepSet:
		return usagef(cmd, "--keep N is required")
	case keep < 0:
		return usagef(cmd, "--keep %d: want 0 or more", keep)
	}
	var n int64
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		n, err = st.Checkpoints().Cleanup(ctx, task, keep)
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		return c.printJSON(struct {
			TaskID  string `json:"task_id"`
			Keep    int    `json:"keep"`
			Deleted int64  `json:"deleted"`
		}{task, keep, n})
	}
	return c.printf("deleted %s of task %s, kept the newest %d", count(n, "checkpoint", "checkpoints"), cell(task), keep)
}

func checkpointRm(ctx context.Context, c *cli, args []string) error {
	var n int64
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		n, err = st.Checkpoints().DeleteAll(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return notFoundf("task %q has no checkpoints", args[0])
	}
	if c.isJSON() {
		return c.printJSON(struct {
			TaskID  string `json:"task_id"`
			Deleted int64  `json:"deleted"`
		}{args[0], n})
	}
	return c.printf("deleted %s of task %s", count(n, "checkpoint", "checkpoints"), cell(args[0]))
}
