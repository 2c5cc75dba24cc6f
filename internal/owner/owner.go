// Package owner makes the identities holdings carry in a store: an
// operator-readable label plus a random suffix unique to the holder, so
// that two holders never share a holding even when given one label.
package owner

import (
	crand "crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
)

// ID returns label (default hostname:pid) plus "#" and 12 random hex
// digits.
func ID(label string) string {
	if label == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "unknown-host"
		}
		if len(host) > 255 {
			host = host[:255]
		}
		label = host + ":" + strconv.Itoa(os.Getpid())
	}
	var b [6]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand panics rather)
	return label + "#" + hex.EncodeToString(b[:])
}
