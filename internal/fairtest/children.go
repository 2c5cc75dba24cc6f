package fairtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/warden-go/warden/internal/testkit"
)

// Children runs procs copies of the test binary as child processes, each
// with env set to spec, and returns their results. A child writes "r" once
// ready, starts on a line from stdin (all children start together), and
// writes its testkit.FairResult as JSON (see Child).
func Children(t *testing.T, ctx context.Context, procs int, env, spec string) []testkit.FairResult {
	t.Helper()
	type child struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	var children []child
	for range procs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), env+"="+spec)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		children = append(children, child{cmd, in, bufio.NewReader(out)})
	}
	line := func(r *bufio.Reader) string {
		s, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("child output: %v", err)
		}
		return strings.TrimSuffix(s, "\n")
	}
	for _, c := range children {
		if s := line(c.out); s != "r" {
			t.Fatalf("child not ready: %q", s)
		}
	}
	for _, c := range children {
		if _, err := io.WriteString(c.in, "g\n"); err != nil {
			t.Fatal(err)
		}
	}
	var results []testkit.FairResult
	for i, c := range children {
		s := line(c.out)
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		var r testkit.FairResult
		if err := json.Unmarshal([]byte(s), &r); err != nil {
			t.Fatalf("child %d: %v (%q)", i, err, s)
		}
		results = append(results, r)
	}
	return results
}

// Child is the child process's side of Children: once start has set up
// its workers it writes "r", waits for the line that starts every child,
// runs run and writes its result. It returns the process's exit code.
func Child(run func() testkit.FairResult) int {
	fmt.Println("r")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	b, _ := json.Marshal(run())
	fmt.Println(string(b))
	return 0
}
