package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/echomq/valkeystream"
)

// A name on the command line is a topic or a stream key. With no key prefix
// (no --prefix, no VALKEYSTREAM_KEY_PREFIX) the two are the same, as they
// are for a Subscriber without KeyPrefix. With a prefix, a name that begins
// with it is a stream key and is taken as given; any other name is a topic
// and gets the prefix. So every stream key under the prefix can be typed
// as it is, every topic can be typed without the prefix, and a key outside
// the prefix is reached with --prefix "".

// stream is a stream named on the command line.
type stream struct {
	Topic string // Key without the prefix; Key when it lies outside it
	Key   string
}

// String is the stream as a header shows it: the key, and the topic when
// they differ.
func (s stream) String() string {
	if s.Topic == s.Key {
		return strconv.Quote(s.Key)
	}
	return fmt.Sprintf("%q (topic %q)", s.Key, s.Topic)
}

// keyPrefix returns --prefix, or VALKEYSTREAM_KEY_PREFIX when the flag is
// not given.
func (fs *flagSet) keyPrefix() (string, error) {
	prefix := fs.getenv("VALKEYSTREAM_KEY_PREFIX")
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "prefix" {
			prefix = fs.prefix
		}
	})
	if strings.ContainsAny(prefix, "{}") {
		return "", usagef("key prefix %q contains '{' or '}', which no Subscriber or Publisher accepts as KeyPrefix", prefix)
	}
	return prefix, nil
}

// stream returns the stream that name names: a topic or a stream key.
func (e *env) stream(name string) stream {
	if e.prefix == "" {
		return stream{Topic: name, Key: name}
	}
	if topic, ok := strings.CutPrefix(name, e.prefix); ok {
		return stream{Topic: topic, Key: name}
	}
	return stream{Topic: name, Key: e.prefix + name}
}

// topicOf returns the topic of a stream key: the key without the prefix,
// or the key itself when it lies outside the prefix.
func (e *env) topicOf(key string) string {
	if topic, ok := strings.CutPrefix(key, e.prefix); ok && e.prefix != "" {
		return topic
	}
	return key
}

// noteStream tells the person at the terminal which stream key a topic
// became, when a prefix is in use.
func (e *env) noteStream(s stream) {
	if e.prefix != "" {
		e.note("stream %s", s)
	}
}

// deadStream returns the dead-letter stream that name names: a dead-letter
// topic or key (ending in valkeystream.DefaultDeadLetterSuffix), a source
// topic or key whose dead-letter stream exists (name plus the suffix), or
// a dead-letter stream of another name, which must hold dead letters.
func (e *env) deadStream(ctx context.Context, name string) (stream, error) {
	s := e.stream(name)
	if strings.HasSuffix(s.Key, valkeystream.DefaultDeadLetterSuffix) {
		return s, nil
	}
	dead := stream{Topic: s.Topic + valkeystream.DefaultDeadLetterSuffix, Key: s.Key + valkeystream.DefaultDeadLetterSuffix}
	pipe := e.client.Pipeline()
	deadExists, exists := pipe.Exists(ctx, dead.Key), pipe.Exists(ctx, s.Key)
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if err := errors.Join(deadExists.Err(), exists.Err()); err != nil {
		return stream{}, e.serverErr(fmt.Sprintf("looking for dead-letter stream %q or %q", dead.Key, s.Key), err)
	}
	switch {
	case deadExists.Val() > 0:
		return dead, nil
	case exists.Val() == 0:
		return stream{}, fmt.Errorf("no dead letters for %q: neither %q nor %q exists (run \"valkeystream streams\" to list streams)", name, dead.Key, s.Key)
	}
	// A dead-letter stream of another name (DeadLetterConfig.Topic): its
	// entries carry the dead-letter error.
	first, err := e.client.XRangeN(ctx, s.Key, "-", "+", 1).Result()
	if err != nil {
		return stream{}, e.serverErr("reading stream "+strconv.Quote(s.Key), err)
	}
	if len(first) > 0 {
		if _, ok := first[0].Values[valkeystream.MetadataError]; !ok {
			return stream{}, fmt.Errorf("stream %s holds no dead letters (its first entry has no %s field), and its dead-letter stream %q does not exist: nothing has been dead-lettered from it yet",
				s, valkeystream.MetadataError, dead.Key)
		}
	}
	return s, nil
}

// noteDead tells the person at the terminal which dead-letter stream name
// was taken for, when it is not name itself.
func (e *env) noteDead(name string, s stream) {
	if e.prefix != "" || s.Key != name {
		e.note("dead-letter stream %s", s)
	}
}

// named returns the stream of a key.
func (e *env) named(key string) stream { return stream{Topic: e.topicOf(key), Key: key} }

// noStream is the error for a stream key that does not exist.
func (e *env) noStream(key string) error {
	return fmt.Errorf("stream %s does not exist (run \"valkeystream streams\" to list streams)%s", e.named(key), e.prefixHint())
}

// prefixHint is advice for a name that was not found: without a prefix, a
// topic of an application with a KeyPrefix is not its stream key.
func (e *env) prefixHint() string {
	if e.prefix != "" {
		return ""
	}
	return "; if it is a topic of an application with a KeyPrefix, give the prefix with --prefix or VALKEYSTREAM_KEY_PREFIX"
}
