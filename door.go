package valkeystream

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// openGroup is the group door: XGROUP CREATE <key> <group> <start> MKSTREAM,
// where BUSYGROUP is success and every other reply an error.
func (s *Subscriber) openGroup(ctx context.Context, key string) error {
	err := s.config.Client.XGroupCreateMkStream(ctx, key, s.config.ConsumerGroup, s.config.Start.id()).Err()
	if err == nil || redis.HasErrorPrefix(err, "BUSYGROUP") {
		return nil
	}
	return &GroupCreateError{Key: key, Group: s.config.ConsumerGroup, Err: err}
}

// checkScripts runs both server-side scripts of the loop once, with
// arguments that change nothing, so that a client that may not run scripts
// fails at Subscribe rather than at its first Nack, and so that the server
// has them cached.
func (s *Subscriber) checkScripts(ctx context.Context, key string) error {
	group, consumer := s.config.ConsumerGroup, s.config.Consumer
	err := renewScript.Run(ctx, s.config.Client, []string{key}, group, consumer).Err()
	if err == nil {
		err = claimBackScript.Run(ctx, s.config.Client, []string{key}, group, consumer, "0-1", 0).Err()
	}
	if err == nil || errors.Is(err, redis.Nil) {
		return nil
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: the server refused to run the subscription's scripts (EVALSHA, EVAL); allow them for this client: %w",
			key, group, err)
	}
	return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: checking the subscription's scripts: %w", key, group, err)
}
