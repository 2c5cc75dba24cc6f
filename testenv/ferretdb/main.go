// Command ferretdb runs the MongoDB-compatible test server warden's MongoDB
// store is tested against: FerretDB embedded as a library, with its SQLite
// handler, listening on a loopback TCP port.
//
//	ferretdb -listen 127.0.0.1:27017 -state testenv/.run/ferretdb
//	ferretdb -ping 127.0.0.1:27017   # exit 0 once the server accepts connections
//
// testenv/ferretdb/up.sh builds and starts it; tests find it through
// WARDEN_TEST_MONGODB_URL.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "loopback TCP address to listen on; port 0: a free port the kernel picks")
	portFile := flag.String("port-file", "", "write the port listened on to this file once the server is starting")
	state := flag.String("state", "ferretdb-state", "directory holding the SQLite databases")
	ping := flag.String("ping", "", "only check that a server accepts connections at this address, then exit")
	logLevel := flag.String("log-level", "error", "log level: debug, info, warn or error")
	flag.Parse()

	if *ping != "" {
		if err := probe(*ping); err != nil {
			fmt.Fprintln(os.Stderr, "ferretdb: ping:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*listen, *state, *logLevel, *portFile); err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
}

func run(listen, state, logLevel, portFile string) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	dir, err := filepath.Abs(state)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Clients reach FerretDB through the write-serialising proxy (see
	// proxy.go) on the public address; FerretDB itself listens on an
	// internal loopback port.
	public, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	defer public.Close()
	internal, err := resolvePort("127.0.0.1:0")
	if err != nil {
		return err
	}
	if portFile != "" {
		defer os.Remove(portFile)
		_, port, _ := net.SplitHostPort(public.Addr().String())
		if err := os.WriteFile(portFile, []byte(port+"\n"), 0o644); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	f, err := ferretdb.New(&ferretdb.Config{
		Listener: ferretdb.ListenerConfig{TCP: internal},
		Logger:   logger,
		Handler:  "sqlite",
		// Immediate transactions: concurrent writers wait for the lock
		// (busy_timeout) instead of failing with "database is locked".
		SQLiteURL: "file:" + filepath.ToSlash(dir) + "/?_txlock=immediate",
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger.Warn("ferretdb starting", "listen", public.Addr().String(), "internal", internal, "state", dir)
	p := &proxy{upstream: internal, log: logger}
	go func() { _ = p.serve(public) }()
	return f.Run(ctx)
}

// resolvePort replaces port 0 with a free port: the kernel picks one for a
// listener that is closed at once, and FerretDB binds it right after.
func resolvePort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("-listen: %w", err)
	}
	if port != "0" {
		return addr, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// probe checks that addr accepts a TCP connection and answers a MongoDB
// "ping" command sent as an OP_MSG.
func probe(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// BSON document {ping: 1, $db: "admin"}.
	doc := []byte{}
	doc = append(doc, 0x10) // int32
	doc = append(doc, "ping\x00"...)
	doc = append(doc, 1, 0, 0, 0)
	doc = append(doc, 0x02) // string
	doc = append(doc, "$db\x00"...)
	doc = append(doc, 6, 0, 0, 0)
	doc = append(doc, "admin\x00"...)
	doc = append(doc, 0)
	doc = append(le32(uint32(len(doc)+4)), doc...)
	body := append(le32(0), 0) // flag bits, section kind 0
	body = append(body, doc...)
	header := le32(uint32(16 + len(body)))
	header = append(header, le32(1)...)    // requestID
	header = append(header, le32(0)...)    // responseTo
	header = append(header, le32(2013)...) // OP_MSG
	if _, err := conn.Write(append(header, body...)); err != nil {
		return err
	}
	reply := make([]byte, 16)
	if _, err := readFull(conn, reply); err != nil {
		return fmt.Errorf("no reply: %w", err)
	}
	if op := u32(reply[12:]); op != 2013 {
		return fmt.Errorf("unexpected reply opcode %d", op)
	}
	n := u32(reply)
	if n < 16 || n > 1<<20 {
		return fmt.Errorf("unexpected reply length %d", n)
	}
	if _, err := readFull(conn, make([]byte, n-16)); err != nil {
		return fmt.Errorf("short reply: %w", err)
	}
	return nil
}

func u32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }

func readFull(conn net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := conn.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
