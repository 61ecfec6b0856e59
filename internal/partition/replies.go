package partition

import (
	"fmt"

	"github.com/echomq/valkeystream/internal/loop"
)

// The readers of the fenced scripts' replies, after their 'ok'.

// parseHandOver reads {next cursor, moved, deleted ids}.
func parseHandOver(rest []any) (HandedOver, error) {
	if len(rest) != 3 {
		return HandedOver{}, fmt.Errorf("partition: unexpected hand-over reply %v", rest)
	}
	next, ok1 := rest[0].(string)
	moved, ok2 := rest[1].(int64)
	if !ok1 || !ok2 {
		return HandedOver{}, fmt.Errorf("partition: unexpected hand-over reply %v", rest)
	}
	h := HandedOver{Next: next, Moved: moved}
	ids, _ := rest[2].([]any)
	for _, v := range ids {
		if id, ok := v.(string); ok {
			h.Deleted = append(h.Deleted, id)
		}
	}
	return h, nil
}

// parseRead reads {XREADGROUP reply}: nil, or one stream's [key, entries].
func parseRead(rest []any) ([]loop.Entry, error) {
	es, _, err := parseReadTop(rest)
	return es, err
}

// parseReadTop reads {XREADGROUP reply[, the stream's last id]}: the
// entries, or none and the id after which to wait for new ones ("" when
// the reply has none).
func parseReadTop(rest []any) ([]loop.Entry, string, error) {
	switch {
	case len(rest) == 2 && rest[0] == nil:
		top, ok := rest[1].(string)
		if !ok {
			return nil, "", fmt.Errorf("partition: unexpected read reply %v", rest)
		}
		return nil, top, nil
	case len(rest) != 1:
		return nil, "", fmt.Errorf("partition: unexpected read reply %v", rest)
	case rest[0] == nil:
		return nil, "", nil
	}
	es, err := parseStreams(rest[0])
	return es, "", err
}

// parseStreams reads an XREADGROUP reply of one stream.
func parseStreams(reply any) ([]loop.Entry, error) {
	var es []loop.Entry
	streams, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("partition: unexpected read reply of type %T", reply)
	}
	for _, st := range streams {
		pair, ok := st.([]any)
		if !ok || len(pair) != 2 {
			return nil, fmt.Errorf("partition: unexpected stream %v in a read reply", st)
		}
		list, _ := pair[1].([]any)
		for _, item := range list {
			e, err := parseEntry(item)
			if err != nil {
				return nil, err
			}
			es = append(es, e)
		}
	}
	return es, nil
}

// parseEntry reads [id, fields]; fields nil when the body is gone.
func parseEntry(item any) (loop.Entry, error) {
	pair, ok := item.([]any)
	if !ok || len(pair) != 2 {
		return loop.Entry{}, fmt.Errorf("partition: unexpected entry %v", item)
	}
	id, ok := pair[0].(string)
	if !ok {
		return loop.Entry{}, fmt.Errorf("partition: unexpected entry id of type %T", pair[0])
	}
	e := loop.Entry{ID: id}
	if pair[1] != nil {
		var err error
		if e.Fields, err = loop.FieldMap(pair[1]); err != nil {
			return loop.Entry{}, err
		}
	}
	return e, nil
}

// parseCount reads {n}.
func parseCount(rest []any) (int64, error) {
	if len(rest) == 1 {
		if n, ok := rest[0].(int64); ok {
			return n, nil
		}
	}
	return 0, fmt.Errorf("partition: unexpected count reply %v", rest)
}

// parseCounts reads {{count, ...}} of want counts.
func parseCounts(rest []any, want int) ([]int64, error) {
	var list []any
	if len(rest) == 1 {
		list, _ = rest[0].([]any)
	}
	if len(list) != want {
		return nil, fmt.Errorf("partition: the hold call answered %v for %d entries", rest, want)
	}
	counts := make([]int64, want)
	for i, v := range list {
		n, ok := v.(int64)
		if !ok {
			return nil, fmt.Errorf("partition: unexpected delivery count %v in the hold reply", v)
		}
		counts[i] = n
	}
	return counts, nil
}
