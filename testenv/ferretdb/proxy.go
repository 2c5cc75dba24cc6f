package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// FerretDB 1.24 runs a conditional write (update, findAndModify, delete) as
// a query followed by a separate write by _id, so two concurrent writes to
// one document can both see its old state: a filter that should let only
// one of them through ("the lock is free") lets both. MongoDB applies each
// single-document write atomically, and warden relies on that. The test
// server therefore puts a small proxy in front of FerretDB that runs the
// conditional writes to one document (found by the _id in the filter) one
// at a time, and updates of several documents and schema changes alone.
// Inserts into one collection run one at a time (see classify). Reads,
// deletes of several documents and getMores waiting for new data run in
// parallel.

// docWrites are the commands that write documents chosen by a filter.
var docWrites = map[string]string{"update": "updates", "delete": "deletes", "findAndModify": "", "findandmodify": ""}

// exclusive are the commands that run alone.
var exclusive = map[string]bool{
	"create": true, "createIndexes": true, "drop": true, "dropDatabase": true, "dropIndexes": true, "renameCollection": true,
}

const (
	opMsg       = 2013
	moreToCome  = 1 << 1
	maxMsgBytes = 48 << 20
)

// proxy accepts clients on l and relays them to upstream.
type proxy struct {
	upstream string
	log      *slog.Logger
	all      sync.RWMutex // held shared by one-document writes, alone by the others

	mu   sync.Mutex
	docs map[string]*docLock // one-document writes in progress, by collection and _id
}

type docLock struct {
	sync.Mutex
	refs int
}

// lock takes what the request needs and returns its release.
func (p *proxy) lock(req []byte) func() {
	kind, key := classify(req)
	switch kind {
	case lockNone:
		return func() {}
	case lockAll:
		p.all.Lock()
		return p.all.Unlock
	}
	p.all.RLock()
	p.mu.Lock()
	if p.docs == nil {
		p.docs = map[string]*docLock{}
	}
	l := p.docs[key]
	if l == nil {
		l = &docLock{}
		p.docs[key] = l
	}
	l.refs++
	p.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		p.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(p.docs, key)
		}
		p.mu.Unlock()
		p.all.RUnlock()
	}
}

func (p *proxy) serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go p.relay(c)
	}
}

func (p *proxy) relay(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.upstream)
	if err != nil {
		p.log.Error("proxy: dial FerretDB", "error", err)
		return
	}
	defer server.Close()
	for {
		req, err := readMsg(client)
		if err != nil {
			return
		}
		req = stripMaxTime(req)
		unlock := p.lock(req)
		err = p.exchange(server, client, req)
		unlock()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.log.Debug("proxy: relay ended", "error", err)
			}
			return
		}
	}
}

// exchange sends one request and relays its replies.
func (p *proxy) exchange(server, client net.Conn, req []byte) error {
	if _, err := server.Write(req); err != nil {
		return err
	}
	if opcode(req) == opMsg && flags(req)&moreToCome != 0 {
		return nil // the client expects no reply
	}
	for {
		rep, err := readMsg(server)
		if err != nil {
			return err
		}
		if _, err := client.Write(rep); err != nil {
			return err
		}
		if opcode(rep) != opMsg || flags(rep)&moreToCome == 0 {
			return nil
		}
	}
}

func readMsg(c net.Conn) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n < 16 || n > maxMsgBytes {
		return nil, fmt.Errorf("message length %d", n)
	}
	msg := make([]byte, n)
	copy(msg, h[:])
	if _, err := io.ReadFull(c, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

func opcode(m []byte) uint32 { return binary.LittleEndian.Uint32(m[12:]) }

func flags(m []byte) uint32 {
	if len(m) < 20 {
		return 0
	}
	return binary.LittleEndian.Uint32(m[16:])
}

const (
	lockNone = iota // a read, an insert, or not an OP_MSG
	lockDoc         // a write to the one document named by _id
	lockAll         // any other write
)

// classify tells what an OP_MSG request needs, and for a one-document
// write its key (database, collection and _id).
func classify(m []byte) (kind int, key string) {
	if opcode(m) != opMsg || len(m) < 21 {
		return lockNone, ""
	}
	var body bsoncore.Document
	seqs := map[string][]bsoncore.Document{}
	b := m[20:]
	if flags(m)&1 != 0 && len(b) >= 4 { // checksum present
		b = b[:len(b)-4]
	}
	for len(b) > 0 {
		sec := b[0]
		b = b[1:]
		if len(b) < 4 {
			return lockAll, ""
		}
		size := int(binary.LittleEndian.Uint32(b))
		if size > len(b) || size < 5 {
			return lockAll, ""
		}
		switch sec {
		case 0:
			body = bsoncore.Document(b[:size])
		case 1:
			ident, rest, ok := readCString(b[4:size])
			if !ok {
				return lockAll, ""
			}
			for len(rest) > 0 {
				d, r, ok := bsoncore.ReadDocument(rest)
				if !ok {
					return lockAll, ""
				}
				seqs[ident] = append(seqs[ident], d)
				rest = r
			}
		}
		b = b[size:]
	}
	if body == nil {
		return lockAll, ""
	}
	first, err := body.IndexErr(0)
	if err != nil {
		return lockAll, ""
	}
	cmd := first.Key()
	if exclusive[cmd] {
		return lockAll, ""
	}
	coll, _ := first.Value().StringValueOK()
	db, _ := body.Lookup("$db").StringValueOK()
	if cmd == "insert" {
		// Inserts into one collection run one at a time: FerretDB numbers
		// a capped collection's records before committing them, so
		// concurrent inserts could commit out of order and a tailable
		// cursor that has read a later record would skip an earlier one
		// for good (MongoDB keeps capped inserts in commit order).
		return lockDoc, db + "\x00" + coll + "\x00insert"
	}
	field, ok := docWrites[cmd]
	if !ok {
		return lockNone, ""
	}
	var filter bsoncore.Document
	if field == "" {
		filter, _ = body.Lookup("query").DocumentOK()
	} else {
		stmts := seqs[field]
		if arr, ok := body.Lookup(field).ArrayOK(); ok {
			vals, _ := arr.Values()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok {
					stmts = append(stmts, d)
				}
			}
		}
		if len(stmts) != 1 {
			if cmd == "delete" {
				return lockNone, ""
			}
			return lockAll, ""
		}
		filter, _ = stmts[0].Lookup("q").DocumentOK()
		if multi, ok := stmts[0].Lookup("multi").BooleanOK(); ok && multi {
			return lockAll, ""
		}
		if limit, ok := stmts[0].Lookup("limit").AsInt64OK(); ok && limit != 1 {
			return lockNone, "" // deleteMany
		}
	}
	if filter == nil {
		return lockAll, ""
	}
	id, err := filter.LookupErr("_id")
	if err != nil || id.Type == bsontype.EmbeddedDocument || id.Type == bsontype.Array || id.Type == bsontype.Regex {
		if cmd == "delete" {
			// Deleting by a filter (expired records, a namespace, old
			// events) runs alongside: like MongoDB's deleteMany it is
			// not atomic across documents.
			return lockNone, ""
		}
		return lockAll, ""
	}
	return lockDoc, db + "\x00" + coll + "\x00" + id.String()
}

func readCString(b []byte) (string, []byte, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], true
		}
	}
	return "", nil, false
}

// stripMaxTime removes maxTimeMS from a command other than getMore. The
// MongoDB driver sends the caller's deadline as maxTimeMS; FerretDB turns
// it into a context whose expiry interrupts the SQLite connection the
// statement runs on, and an interrupt that fires late hits the next
// statement on that connection, which belongs to another client. The
// driver still enforces the deadline on its side. (getMore's maxTimeMS is
// the awaitData wait, kept.)
func stripMaxTime(m []byte) []byte {
	if opcode(m) != opMsg || len(m) < 21 || flags(m)&1 != 0 {
		return m
	}
	off := 20
	for off < len(m) {
		kind := m[off]
		if off+5 > len(m) {
			return m
		}
		size := int(binary.LittleEndian.Uint32(m[off+1:]))
		if size < 5 || off+1+size > len(m) {
			return m
		}
		if kind != 0 {
			off += 1 + size
			continue
		}
		doc := bsoncore.Document(m[off+1 : off+1+size])
		elems, err := doc.Elements()
		if err != nil || len(elems) == 0 || elems[0].Key() == "getMore" {
			return m
		}
		if _, err := doc.LookupErr("maxTimeMS"); err != nil {
			return m
		}
		idx, nd := bsoncore.AppendDocumentStart(nil)
		for _, e := range elems {
			if e.Key() != "maxTimeMS" {
				nd = append(nd, e...)
			}
		}
		nd, err = bsoncore.AppendDocumentEnd(nd, idx)
		if err != nil {
			return m
		}
		out := make([]byte, 0, len(m))
		out = append(out, m[:off+1]...)
		out = append(out, nd...)
		out = append(out, m[off+1+size:]...)
		binary.LittleEndian.PutUint32(out, uint32(len(out)))
		return out
	}
	return m
}
