package main

import (
	"context"
	"flag"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// connect returns the client for opt: a ClusterClient when the flags or
// the environment say the server is a cluster, when --addr lists several
// nodes, or when the node answers that it runs in cluster mode; else a
// plain client. A node that cannot be reached gets a plain client, whose
// first call reports the error with advice.
func (fs *flagSet) connect(ctx context.Context, opt *redis.Options) (redis.UniversalClient, error) {
	addrs := strings.Split(opt.Addr, ",")
	for i := range addrs {
		addrs[i] = strings.TrimSpace(addrs[i])
	}
	cluster, given := fs.clusterFlag()
	if len(addrs) > 1 && given && !cluster {
		return nil, usagef("--addr lists %d nodes but --cluster=false: give one address, or leave --cluster out", len(addrs))
	}
	if !given && len(addrs) == 1 {
		single := *opt
		plain := redis.NewClient(&single)
		if !isClusterNode(ctx, plain) {
			return plain, nil
		}
		_ = plain.Close()
		cluster = true
	}
	if !cluster && len(addrs) == 1 {
		return redis.NewClient(opt), nil
	}
	if opt.DB != 0 {
		return nil, usagef("database %d was asked for, but a cluster has only database 0", opt.DB)
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        addrs,
		Username:     opt.Username,
		Password:     opt.Password,
		TLSConfig:    opt.TLSConfig,
		DialTimeout:  opt.DialTimeout,
		ReadTimeout:  opt.ReadTimeout,
		WriteTimeout: opt.WriteTimeout,
		MaxRetries:   opt.MaxRetries,
		PoolSize:     opt.PoolSize,
	}), nil
}

// clusterFlag returns --cluster, or VALKEYSTREAM_CLUSTER when the flag is
// not given, and whether either was given.
func (fs *flagSet) clusterFlag() (cluster, given bool) {
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "cluster" {
			given = true
		}
	})
	if given {
		return fs.cluster, true
	}
	switch strings.ToLower(fs.getenv("VALKEYSTREAM_CLUSTER")) {
	case "1", "true", "yes":
		return true, true
	case "0", "false", "no":
		return false, true
	}
	return false, false
}

// isClusterNode reports whether the server c talks to runs in cluster mode.
func isClusterNode(ctx context.Context, c *redis.Client) bool {
	info, err := c.Info(ctx, "cluster").Result()
	return err == nil && strings.Contains(info, "cluster_enabled:1")
}

// scanStreams returns up to limit stream keys starting with prefix, sorted:
// on a cluster, those of every master.
func scanStreams(ctx context.Context, c redis.UniversalClient, prefix string, limit int) ([]string, error) {
	all, err := onEveryNode(ctx, c, func(ctx context.Context, node redis.Cmdable) ([]string, error) {
		return scanNode(ctx, node, prefix, limit)
	})
	if err != nil {
		return nil, err
	}
	return all[:min(limit, len(all))], nil
}

// onEveryNode returns the keys scan finds on c, sorted and without
// repeats: on a cluster, on every master.
func onEveryNode(ctx context.Context, c redis.UniversalClient, scan func(context.Context, redis.Cmdable) ([]string, error)) ([]string, error) {
	var all []string
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, master *redis.Client) error {
			keys, err := scan(ctx, master)
			mu.Lock()
			all = append(all, keys...)
			mu.Unlock()
			return err
		})
		if err != nil {
			return nil, err
		}
	} else {
		var err error
		if all, err = scan(ctx, c); err != nil {
			return nil, err
		}
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}
