package dynamo

import (
	"context"
	"sort"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/driver"
)

// idempotency is the idempotency-key driver. A record is one item (pk
// IDEM#<prefix>idem:<key>, sk METADATA) with status, owner, fingerprint,
// data (the result), createdAt and, unless kept until deleted,
// expiresAtMs and expiresAt.
type idempotency struct{ s *store }

func idemLive(it item, now int64) bool {
	return it != nil && (!has(it, aExp) || gN(it, aExp) > now)
}

func idemRec(key string, it item) driver.IdemRecord {
	r := driver.IdemRecord{
		Key: key, Status: driver.IdemStatus(gS(it, aStatus)), Owner: gS(it, aOwner), Fingerprint: gS(it, aFp),
		CreatedAt: msTime(gN(it, aCreated)), ExpiresAt: msTime(gN(it, aExp)),
	}
	if r.Status == driver.IdemCompleted {
		r.Result = gB(it, aData)
	}
	return r
}

// Claim implements driver.Idempotency with one conditional UpdateItem
// (absent or lapsed) whose ALL_OLD copy tells a fresh claim from a
// takeover. When the condition fails, the holder comes from the endpoint
// (ALL_OLD) or one consistent read; owner's own pending claim is renewed
// with a second conditional update. A claim whose every attempt finds the
// item changed under it gives up with an error saying so (errContended),
// never with a made-up "in progress".
func (d idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	s := d.s
	pk := s.idemPfx + key
	tries := s.attempts(retryLimit)
	for range tries {
		s.raced("write")
		now := nowMs()
		exp := now + driver.Millis(lease)
		req := reqID()
		vals := item{":o": vS(owner), ":now": vN(now), ":exp": vN(exp), ":ttl": vN(ttlSeconds(exp)),
			":pending": vS(string(driver.IdemPending)), ":req": vS(req)}
		upd := "SET #status = :pending, #owner = :o, #createdAt = :now, #expiresAtMs = :exp, #expiresAt = :ttl, #req = :req" + lpkSet(s.idemPfx, vals)
		rm := " REMOVE #data"
		if fingerprint != "" {
			vals[":fp"] = vS(fingerprint)
			upd += ", #fingerprint = :fp"
		} else {
			rm += ", #fingerprint"
		}
		attrs, failed, old, err := s.update(ctx, "claiming idempotency key", pk, metaSK, upd+rm,
			"attribute_not_exists(#pk) OR #expiresAtMs <= :now", vals, types.ReturnValueAllOld)
		if err != nil {
			return driver.IdemRecord{}, 0, err
		}
		rec := driver.IdemRecord{Key: key, Status: driver.IdemPending, Owner: owner, Fingerprint: fingerprint,
			CreatedAt: msTime(now), ExpiresAt: msTime(exp)}
		if !failed {
			if gS(attrs, aStatus) == string(driver.IdemPending) {
				return rec, driver.TakenOver, nil
			}
			return rec, driver.Claimed, nil
		}
		if old == nil {
			if old, err = s.get(ctx, "reading idempotency key", pk, metaSK); err != nil {
				return driver.IdemRecord{}, 0, err
			}
		}
		if old != nil && gS(old, aReq) == req {
			return rec, driver.Claimed, nil // the SDK resent a claim that had applied
		}
		if idemLive(old, nowMs()) {
			r := idemRec(key, old)
			switch {
			case r.Status == driver.IdemCompleted:
				return r, driver.Completed, nil
			case r.Owner != owner:
				return r, driver.InProgress, nil
			}
			s.raced("renew")
			it, ok, err := d.extend(ctx, key, owner, lease)
			if err != nil {
				return driver.IdemRecord{}, 0, err
			}
			if ok {
				return idemRec(key, it), driver.Claimed, nil
			}
		}
		// The item changed between the condition and the read (or under
		// the renewal): try again.
	}
	// No claim was made and nobody else's is known: say so, rather than
	// report one in progress.
	return driver.IdemRecord{}, 0, &contendedError{op: "claiming idempotency key", key: key, tries: tries}
}

func (d idempotency) extend(ctx context.Context, key, owner string, lease time.Duration) (item, bool, error) {
	now := nowMs()
	exp := now + driver.Millis(lease)
	attrs, failed, _, err := d.s.update(ctx, "extending idempotency claim", d.s.idemPfx+key, metaSK,
		"SET #expiresAtMs = :exp, #expiresAt = :ttl", "#status = :pending AND #owner = :o",
		item{":exp": vN(exp), ":ttl": vN(ttlSeconds(exp)), ":pending": vS(string(driver.IdemPending)), ":o": vS(owner)},
		types.ReturnValueAllNew)
	if err != nil || failed {
		return nil, false, err
	}
	return attrs, true, nil
}

// Extend implements driver.Idempotency: one conditional UpdateItem.
func (d idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	_, ok, err := d.extend(ctx, key, owner, lease)
	return ok, err
}

// Complete implements driver.Idempotency: one conditional UpdateItem.
func (d idempotency) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (bool, error) {
	s := d.s
	pk := s.idemPfx + key
	now := nowMs()
	req := reqID()
	vals := item{":o": vS(owner), ":pending": vS(string(driver.IdemPending)), ":done": vS(string(driver.IdemCompleted)), ":req": vS(req)}
	upd := "SET #status = :done, #req = :req"
	var rm []string
	if len(result) > 0 {
		vals[":data"] = vB(result)
		upd += ", #data = :data"
	} else {
		rm = append(rm, "#data")
	}
	if retain > 0 {
		exp := now + driver.Millis(retain)
		vals[":exp"], vals[":ttl"] = vN(exp), vN(ttlSeconds(exp))
		upd += ", #expiresAtMs = :exp, #expiresAt = :ttl"
	} else {
		rm = append(rm, "#expiresAtMs", "#expiresAt")
	}
	if len(rm) > 0 {
		upd += " REMOVE " + join(rm)
	}
	_, failed, old, err := s.update(ctx, "completing idempotency key", pk, metaSK, upd, "#status = :pending AND #owner = :o", vals, types.ReturnValueNone)
	if err != nil || !failed {
		return err == nil, err
	}
	if old == nil {
		if old, err = s.get(ctx, "reading idempotency key", pk, metaSK); err != nil {
			return false, err
		}
	}
	return old != nil && gS(old, aReq) == req, nil
}

func join(xs []string) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}

// Abandon implements driver.Idempotency: one conditional DeleteItem.
func (d idempotency) Abandon(ctx context.Context, key, owner string) (bool, error) {
	_, failed, err := d.s.del(ctx, "abandoning idempotency claim", d.s.idemPfx+key, metaSK,
		"#status = :pending AND #owner = :o", item{":pending": vS(string(driver.IdemPending)), ":o": vS(owner)})
	return err == nil && !failed, err
}

// Get implements driver.Idempotency: one consistent GetItem.
func (d idempotency) Get(ctx context.Context, key string) (driver.IdemRecord, bool, error) {
	it, err := d.s.get(ctx, "reading idempotency key", d.s.idemPfx+key, metaSK)
	if err != nil || !idemLive(it, nowMs()) {
		return driver.IdemRecord{}, false, err
	}
	return idemRec(key, it), true, nil
}

// Set implements driver.Idempotency: one PutItem of a completed record.
func (d idempotency) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	now := nowMs()
	it := itemKey(d.s.idemPfx+key, metaSK)
	it[aStatus] = vS(string(driver.IdemCompleted))
	it[aCreated] = vN(now)
	it[aLpk] = vS(d.s.idemPfx)
	if len(result) > 0 {
		it[aData] = vB(result)
	}
	if ttl > 0 {
		exp := now + driver.Millis(ttl)
		it[aExp], it[aTTL] = vN(exp), vN(ttlSeconds(exp))
	}
	_, err := d.s.put(ctx, "writing idempotency key", it, "", nil)
	return err
}

// Delete implements driver.Idempotency: one DeleteItem returning the old
// item.
func (d idempotency) Delete(ctx context.Context, key string) (bool, error) {
	old, _, err := d.s.del(ctx, "deleting idempotency key", d.s.idemPfx+key, metaSK, "", nil)
	return idemLive(old, nowMs()), err
}

// List implements driver.Idempotency: see locks.List.
func (d idempotency) List(ctx context.Context, pattern driver.Pattern) ([]driver.IdemRecord, error) {
	s := d.s
	var out []driver.IdemRecord
	now := nowMs()
	err := s.list(ctx, "listing idempotency keys", s.idemPfx, pattern, func(it item) error {
		k, ok := cutPrefix(gS(it, aPk), s.idemPfx)
		if ok && gS(it, aSk) == metaSK && pattern.Match(k) && idemLive(it, now) {
			out = append(out, idemRec(k, it))
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, err
}
