package mongo_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The wire double: a client's connections to the test server pass through
// it, in the test's own process (the client's dialer), so that a test can
// stage what a real MongoDB does when writers race — another writer's
// change landing between a command's dispatch and its execution, or
// between a collision and the read that follows it, or a winner's insert a
// read does not see yet — and see what the store does next. It also
// answers a duplicate key the way MongoDB words it.
//
// It reads the wire protocol's OP_MSG messages (the only ones the driver
// sends for commands once connected) and relays everything else as it
// is. A connection string that asks for TLS cannot be read this way: the
// tests that need the double skip on such a server.

// wireCmd is a command a client sent through the double.
type wireCmd struct {
	Name string                // the command: its first field
	Coll string                // the collection the command names, if any
	Body bson.Raw              // the command document
	Seqs map[string][]bson.Raw // its document sequences (the documents of an insert, the statements of an update)
}

// wireStep is what the double does with one command. The zero value
// relays it.
type wireStep struct {
	before func()               // runs before the command goes to the server
	answer bson.Raw             // the reply to send instead of the server's: the command is not sent
	after  func(reply bson.Raw) // runs when the server's reply is in, before the client reads it
}

// wire is the double's state, shared by the connections of one client.
type wire struct {
	mu    sync.Mutex
	route func(c wireCmd) wireStep // nil: relay every command
}

// setRoute sets the function that chooses each command's step.
func (w *wire) setRoute(f func(c wireCmd) wireStep) {
	w.mu.Lock()
	w.route = f
	w.mu.Unlock()
}

func (w *wire) step(c wireCmd) wireStep {
	w.mu.Lock()
	f := w.route
	w.mu.Unlock()
	if f == nil {
		return wireStep{}
	}
	return f(c)
}

// DialContext implements options.ContextDialer: the driver's end of a pipe
// whose other end the double relays to the server.
func (w *wire) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	up, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	client, relay := net.Pipe()
	c := &wireConn{w: w, client: relay, up: up, pending: map[int32]pending{}}
	go c.requests()
	go c.replies()
	return client, nil
}

// pending is a command sent to the server whose reply has not come back.
type pending struct {
	cmd   wireCmd
	after func(bson.Raw)
}

type wireConn struct {
	w          *wire
	client, up net.Conn
	wmu        sync.Mutex // writes to client

	mu      sync.Mutex
	pending map[int32]pending // by request id
}

func (c *wireConn) close() {
	c.client.Close()
	c.up.Close()
}

func (c *wireConn) toClient(msg []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.client.Write(msg)
	return err
}

// requests relays the client's messages to the server.
func (c *wireConn) requests() {
	defer c.close()
	for {
		msg, err := readWire(c.client)
		if err != nil {
			return
		}
		if cmd, ok := parseCmd(msg); ok {
			st := c.w.step(cmd)
			if st.before != nil {
				st.before()
			}
			if st.answer != nil {
				if c.toClient(opMsg(reqID(msg), st.answer)) != nil {
					return
				}
				continue
			}
			c.mu.Lock()
			c.pending[reqID(msg)] = pending{cmd: cmd, after: st.after}
			c.mu.Unlock()
		}
		if _, err := c.up.Write(msg); err != nil {
			return
		}
	}
}

// replies relays the server's messages to the client, in MongoDB's words.
func (c *wireConn) replies() {
	defer c.close()
	for {
		msg, err := readWire(c.up)
		if err != nil {
			return
		}
		if op(msg) == wireOpMsg {
			c.mu.Lock()
			p, ok := c.pending[respTo(msg)]
			delete(c.pending, respTo(msg))
			c.mu.Unlock()
			if body, flags, okBody := replyBody(msg); ok && okBody && flags&moreToCome == 0 {
				if r, changed := asMongoDB(p.cmd, body); changed {
					body = r
					msg = opMsg(respTo(msg), body)
				}
				if p.after != nil {
					p.after(body)
				}
			}
		}
		if err := c.toClient(msg); err != nil {
			return
		}
	}
}

const (
	wireOpMsg  = 2013
	moreToCome = 1 << 1
	checksum   = 1 << 0
)

func readWire(r io.Reader) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(h[:]))
	if n < 16 || n > 64<<20 {
		return nil, fmt.Errorf("wire double: message of %d bytes", n)
	}
	msg := make([]byte, n)
	copy(msg, h[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

func reqID(msg []byte) int32  { return int32(binary.LittleEndian.Uint32(msg[4:])) }
func respTo(msg []byte) int32 { return int32(binary.LittleEndian.Uint32(msg[8:])) }
func op(msg []byte) int32     { return int32(binary.LittleEndian.Uint32(msg[12:])) }

// sections splits an OP_MSG into its body and document sequences.
func sections(msg []byte) (flags uint32, body bson.Raw, seqs map[string][]bson.Raw, ok bool) {
	if op(msg) != wireOpMsg || len(msg) < 21 {
		return 0, nil, nil, false
	}
	flags = binary.LittleEndian.Uint32(msg[16:])
	rest := msg[20:]
	if flags&checksum != 0 {
		rest = rest[:len(rest)-4]
	}
	for len(rest) > 0 {
		kind := rest[0]
		rest = rest[1:]
		switch kind {
		case 0:
			d, rem, ok := bsoncore.ReadDocument(rest)
			if !ok {
				return 0, nil, nil, false
			}
			body, rest = bson.Raw(d), rem
		case 1:
			if len(rest) < 4 {
				return 0, nil, nil, false
			}
			n := int(binary.LittleEndian.Uint32(rest))
			if n < 5 || n > len(rest) {
				return 0, nil, nil, false
			}
			seq := rest[4:n]
			rest = rest[n:]
			i := strings.IndexByte(string(seq), 0)
			if i < 0 {
				return 0, nil, nil, false
			}
			id := string(seq[:i])
			for seq = seq[i+1:]; len(seq) > 0; {
				d, rem, ok := bsoncore.ReadDocument(seq)
				if !ok {
					return 0, nil, nil, false
				}
				if seqs == nil {
					seqs = map[string][]bson.Raw{}
				}
				seqs[id] = append(seqs[id], bson.Raw(d))
				seq = rem
			}
		default:
			return 0, nil, nil, false
		}
	}
	return flags, body, seqs, body != nil
}

func parseCmd(msg []byte) (wireCmd, bool) {
	_, body, seqs, ok := sections(msg)
	if !ok {
		return wireCmd{}, false
	}
	els, err := body.Elements()
	if err != nil || len(els) == 0 {
		return wireCmd{}, false
	}
	c := wireCmd{Name: els[0].Key(), Body: body, Seqs: seqs}
	c.Coll, _ = els[0].Value().StringValueOK()
	return c, true
}

func replyBody(msg []byte) (bson.Raw, uint32, bool) {
	flags, body, _, ok := sections(msg)
	return body, flags, ok
}

// opMsg is an OP_MSG reply to request id holding body.
func opMsg(id int32, body bson.Raw) []byte {
	msg := make([]byte, 21, 21+len(body))
	binary.LittleEndian.PutUint32(msg[0:], uint32(21+len(body)))
	binary.LittleEndian.PutUint32(msg[4:], uint32(id)^0x5a5a) // any id of the double's
	binary.LittleEndian.PutUint32(msg[8:], uint32(id))
	binary.LittleEndian.PutUint32(msg[12:], wireOpMsg)
	return append(msg, body...)
}

// docID returns the string _id a command's statement i names: the query of
// a findAndModify, the filter of an update, the document of an insert.
func (c wireCmd) docID(i int) (string, bool) {
	var d bson.Raw
	switch c.Name {
	case "findAndModify", "findandmodify":
		d, _ = c.Body.Lookup("query").DocumentOK()
	case "update":
		if u := c.stmt("updates", i); u != nil {
			d, _ = u.Lookup("q").DocumentOK()
		}
	case "insert":
		d = c.stmt("documents", i)
	}
	if d == nil {
		return "", false
	}
	return d.Lookup("_id").StringValueOK()
}

// stmt returns statement i of the command's list name, sent as a document
// sequence or in the body.
func (c wireCmd) stmt(name string, i int) bson.Raw {
	if s := c.Seqs[name]; i < len(s) {
		return s[i]
	}
	arr, ok := c.Body.Lookup(name).ArrayOK()
	if !ok {
		return nil
	}
	v, err := arr.IndexErr(uint(i))
	if err != nil {
		return nil
	}
	d, _ := v.DocumentOK()
	return d
}

// upsertOn reports whether c is a findAndModify with upsert on _id id of
// collection coll.
func (c wireCmd) upsertOn(coll, id string) bool {
	if c.Coll != coll || (c.Name != "findAndModify" && c.Name != "findandmodify") {
		return false
	}
	up, _ := c.Body.Lookup("upsert").BooleanOK()
	got, ok := c.docID(0)
	return up && ok && got == id
}

// dupKeyReply is MongoDB's answer to a findAndModify whose insert collided
// on _id id of collection ns ("db.coll").
func dupKeyReply(ns, id string) bson.Raw {
	b, err := bson.Marshal(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: dupKeyMsg(ns, id)},
		{Key: "code", Value: int32(11000)}, {Key: "codeName", Value: "DuplicateKey"},
		{Key: "keyPattern", Value: bson.D{{Key: "_id", Value: int32(1)}}}, {Key: "keyValue", Value: bson.D{{Key: "_id", Value: id}}}})
	if err != nil {
		panic(err)
	}
	return b
}

func dupKeyMsg(ns, id string) string {
	return fmt.Sprintf("E11000 duplicate key error collection: %s index: _id_ dup key: { _id: %q }", ns, id)
}

// isDupReply reports whether a reply is a duplicate-key error, of the
// command or of one of its statements.
func isDupReply(r bson.Raw) bool {
	if code, ok := r.Lookup("code").AsInt64OK(); ok && code == 11000 {
		return true
	}
	if arr, ok := r.Lookup("writeErrors").ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, v := range vals {
			if d, ok := v.DocumentOK(); ok {
				if code, ok := d.Lookup("code").AsInt64OK(); ok && code == 11000 {
					return true
				}
			}
		}
	}
	return false
}

// asMongoDB rewrites a duplicate key on _id that the server reported
// without naming the index (FerretDB) as MongoDB reports it: the index
// _id_ and the key in the message, keyPattern and keyValue beside it.
// Other replies, and those that name an index, are left alone.
func asMongoDB(c wireCmd, reply bson.Raw) (bson.Raw, bool) {
	if !isDupReply(reply) || strings.Contains(reply.String(), " index: ") {
		return reply, false
	}
	var d bson.D
	if err := bson.Unmarshal(reply, &d); err != nil {
		return reply, false
	}
	ns := func(msg string) string {
		_, after, _ := strings.Cut(msg, "collection: ")
		return strings.TrimSpace(after)
	}
	fix := func(e bson.D, i int) (bson.D, bool) {
		id, ok := c.docID(i)
		if !ok {
			return e, false
		}
		out := bson.D{}
		for _, f := range e {
			if f.Key == "errmsg" {
				msg, _ := f.Value.(string)
				f.Value = dupKeyMsg(ns(msg), id)
			}
			out = append(out, f)
		}
		out = append(out, bson.E{Key: "keyPattern", Value: bson.D{{Key: "_id", Value: int32(1)}}},
			bson.E{Key: "keyValue", Value: bson.D{{Key: "_id", Value: id}}})
		return out, true
	}
	changed := false
	if fmt.Sprint(lookupD(d, "code")) == "11000" {
		d, changed = fix(d, 0)
	} else if arr, ok := lookupD(d, "writeErrors").(bson.A); ok {
		for j, we := range arr {
			e, _ := we.(bson.D)
			idx, _ := lookupD(e, "index").(int32)
			if fmt.Sprint(lookupD(e, "code")) == "11000" {
				if e2, ok := fix(e, int(idx)); ok {
					arr[j] = e2
					changed = true
				}
			}
		}
	}
	if !changed {
		return reply, false
	}
	b, err := bson.Marshal(d)
	if err != nil {
		return reply, false
	}
	return b, true
}

func lookupD(d bson.D, key string) any {
	for _, e := range d {
		if e.Key == key {
			return e.Value
		}
	}
	return nil
}

// wireDB returns a database handle on the test server from a client of the
// test's own whose connections pass through a wire double, with extra
// client options; ok is false when the server's URL asks for TLS (the
// double cannot read such a connection).
func wireDB(t testing.TB, co *options.ClientOptions) (*mongodrv.Database, *wire, bool) {
	u, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if u.Scheme != "mongodb" || q.Get("tls") == "true" || q.Get("ssl") == "true" {
		return nil, nil, false
	}
	w := &wire{}
	if co == nil {
		co = options.Client()
	}
	// Compression would hide the commands from the double.
	co.SetDialer(w).SetCompressors([]string{})
	return testDB(t, co), w, true
}

// needWire is wireDB for the tests that cannot run without the double.
func needWire(t testing.TB, co *options.ClientOptions) (*mongodrv.Database, *wire) {
	db, w, ok := wireDB(t, co)
	if !ok {
		t.Skip("the test server's URL asks for TLS: the wire double cannot read its connections")
	}
	return db, w
}
