package loop

import "fmt"

// parseAutoClaim reads an XAUTOCLAIM reply: the next cursor, the claimed
// entries, the ids the server dropped because their bodies are gone (Redis 7
// and later, Valkey), and how many claimed entries came back as a bare null
// (Redis 6.2 reports a claimed entry whose body is gone that way, without its
// id, and keeps it pending for the claiming consumer).
func parseAutoClaim(reply []any) (Claimed, error) {
	var c Claimed
	if len(reply) < 2 {
		return Claimed{}, fmt.Errorf("unexpected XAUTOCLAIM reply with %d elements", len(reply))
	}
	next, ok := reply[0].(string)
	c.Next = next
	if !ok {
		return Claimed{}, fmt.Errorf("unexpected XAUTOCLAIM cursor of type %T", reply[0])
	}
	list, _ := reply[1].([]any)
	for _, item := range list {
		if item == nil {
			c.Nulls++
			continue
		}
		pair, ok := item.([]any)
		if !ok || len(pair) != 2 {
			return Claimed{}, fmt.Errorf("unexpected XAUTOCLAIM entry %v", item)
		}
		id, ok := pair[0].(string)
		if !ok {
			return Claimed{}, fmt.Errorf("unexpected XAUTOCLAIM entry id of type %T", pair[0])
		}
		e := Entry{ID: id}
		if pair[1] != nil {
			var err error
			if e.Fields, err = FieldMap(pair[1]); err != nil {
				return Claimed{}, err
			}
		}
		c.Entries = append(c.Entries, e)
	}
	if len(reply) >= 3 {
		ids, _ := reply[2].([]any)
		for _, v := range ids {
			if id, ok := v.(string); ok {
				c.Deleted = append(c.Deleted, id)
			}
		}
	}
	return c, nil
}

// FieldMap turns an entry's field list (or map, in RESP3) into a map.
func FieldMap(v any) (map[string]any, error) {
	switch f := v.(type) {
	case []any:
		if len(f)%2 != 0 {
			return nil, fmt.Errorf("entry has an odd number (%d) of field elements", len(f))
		}
		m := make(map[string]any, len(f)/2)
		for i := 0; i < len(f); i += 2 {
			k, ok := f[i].(string)
			if !ok {
				return nil, fmt.Errorf("entry field name of type %T", f[i])
			}
			m[k] = f[i+1]
		}
		return m, nil
	case map[any]any:
		m := make(map[string]any, len(f))
		for k, val := range f {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("entry field name of type %T", k)
			}
			m[ks] = val
		}
		return m, nil
	default:
		return nil, fmt.Errorf("entry fields of type %T", v)
	}
}

// ParseClaimBack reads the reply of the Nack claim script: {status[,
// count, fields]} (also a partition's fenced one, after its "ok").
func ParseClaimBack(reply []any) (ClaimedBack, error) {
	if len(reply) == 0 {
		return ClaimedBack{}, fmt.Errorf("empty reply to the nack claim")
	}
	status, _ := reply[0].(string)
	switch status {
	case "gone", "taken", "missing":
		return ClaimedBack{Status: status}, nil
	case "ok":
	default:
		return ClaimedBack{}, fmt.Errorf("unexpected reply to the nack claim: %v", reply)
	}
	if len(reply) != 3 {
		return ClaimedBack{}, fmt.Errorf("unexpected reply to the nack claim: %v", reply)
	}
	count, ok := reply[1].(int64)
	if !ok {
		return ClaimedBack{}, fmt.Errorf("unexpected delivery count %v in the reply to the nack claim", reply[1])
	}
	fields, err := FieldMap(reply[2])
	if err != nil {
		return ClaimedBack{}, err
	}
	return ClaimedBack{Status: status, Count: count, Fields: fields}, nil
}
