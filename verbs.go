package valkeystream

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/serverinfo"
)

// The newer stream verbs (docs/server-verbs.md): a Subscriber finds out
// once which its server has, at its first group Subscribe, and again after
// a call failed as a failover makes calls fail (the client may have moved
// to a node of another version). Behaviour is the same on every path; only
// speed differs, and DeleteAcked needs XACKDEL.

// serverVerbs returns the newer verbs of the Subscriber's server, finding
// them out if it does not know them. A probe that failed answers what was
// known before (nothing the first time): the call that follows fails the
// same way and is retried.
func (s *Subscriber) serverVerbs(ctx context.Context) serverinfo.Verbs {
	v, _ := s.noteVerbs(s.verbs.Verbs(ctx))
	return v
}

// noteVerbs logs an answer of s.verbs that changed, and returns it, or
// what was known before with the error of a failed probe.
func (s *Subscriber) noteVerbs(v serverinfo.Verbs, changed bool, refused string, err error) (serverinfo.Verbs, error) {
	if err != nil {
		return s.verbs.Current(), err
	}
	if changed {
		logVerbs(s.logger, "Subscriber", v, refused)
		if s.config.DeleteAcked && !v.AckDel {
			s.logger.Error("DeleteAcked is set, but the server has no XACKDEL (a failover to an older node?): entries are acknowledged with XACK and stay in the stream until trimmed",
				nil, watermill.LogFields{"verbs": v.String()})
		}
	}
	return v, nil
}

// checkVerbs learns the server's verbs from docs (the reply of
// serverinfo.DocsCommand sent with the door, or nil when they were known
// then) as a group subscription to key starts, and fails it when
// DeleteAcked cannot be honoured.
func (s *Subscriber) checkVerbs(ctx context.Context, key string, docs *redis.Cmd) error {
	v, err := s.noteVerbs(s.verbs.Learn(ctx, docs))
	switch {
	case !s.config.DeleteAcked:
		return nil // a failed probe is tried again by the loop's first call
	case err != nil:
		return fmt.Errorf("valkeystream: subscribing to stream %q: DeleteAcked needs XACKDEL, and asking the server whether it has it failed: %w", key, err)
	case !v.AckDel:
		return fmt.Errorf("valkeystream: subscribing to stream %q: DeleteAcked needs XACKDEL (Redis 8.2 or later, Valkey 9.2 or later), which this server lacks (verbs: %s): unset DeleteAcked, or trim the topic with PublisherConfig.Retention", key, v)
	}
	return nil
}

// logVerbs logs, once per answer, which path a side uses.
func logVerbs(logger watermill.LoggerAdapter, side string, v serverinfo.Verbs, refused string) {
	fields := watermill.LogFields{"verbs": v.String()}
	if refused != "" {
		fields["refused"] = refused
		logger.Info(side+": the server did not say which stream verbs it has; using the baseline path (Redis 6.2 has no COMMAND DOCS; on a later server, allow the user COMMAND DOCS)", fields)
		return
	}
	logger.Info(side+": stream verbs of the server (docs/server-verbs.md)", fields)
}
