package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var errHelp = flag.ErrHelp

// flagSet is a command's flags: the connection and output flags every
// command has, and the command's own.
type flagSet struct {
	*flag.FlagSet
	cmd    *command
	getenv func(string) string

	addr, url, user, password string
	prefix                    string
	db                        int
	timeout                   time.Duration
	json                      bool
	cluster                   bool
}

func newFlagSet(c *command, stderr io.Writer, getenv func(string) string) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(c.name, flag.ContinueOnError), cmd: c, getenv: getenv}
	fs.SetOutput(io.Discard) // errors are printed by run, with advice
	fs.StringVar(&fs.addr, "addr", "", "server `host:port`, or several nodes of a cluster, comma-separated (env VALKEYSTREAM_ADDR; default 127.0.0.1:6379)")
	fs.StringVar(&fs.url, "url", "", "server URL, redis://[user:password@]host:port[/db] or rediss:// for TLS (env VALKEYSTREAM_URL)")
	fs.StringVar(&fs.user, "user", "", "ACL user name (env VALKEYSTREAM_USER)")
	fs.StringVar(&fs.password, "password", "", "password; prefer the environment (env VALKEYSTREAM_PASSWORD)")
	fs.IntVar(&fs.db, "db", 0, "database number")
	fs.DurationVar(&fs.timeout, "timeout", 10*time.Second, "bound of each call to the server")
	fs.BoolVar(&fs.json, "json", false, "print JSON instead of a table")
	fs.StringVar(&fs.prefix, "prefix", "", "the KeyPrefix of the application's Subscribers and Publishers, e.g. shop: (env VALKEYSTREAM_KEY_PREFIX): a name that begins with it is a stream key, any other name a topic, which gets it; --prefix '' names keys outside it")
	fs.BoolVar(&fs.cluster, "cluster", false, "the server is a Redis or Valkey Cluster (env VALKEYSTREAM_CLUSTER=1); without the flag a cluster node is detected, --cluster=false skips that")
	return fs
}

// parse parses args, in which flags and positional arguments may be mixed,
// and returns the positional arguments. "--" ends the flags.
func (fs *flagSet) parse(args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		if args[0] == "--" {
			return append(positional, args[1:]...), nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// usage prints the command's help.
func (fs *flagSet) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: valkeystream %s [flags] %s\n\n%s\n\nFlags:\n", fs.cmd.name, fs.cmd.args, strings.TrimSpace(fs.cmd.help))
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// options returns the client options the flags and the environment give.
func (fs *flagSet) options() (*redis.Options, error) {
	addr, url := fs.addr, fs.url
	if addr == "" && url == "" {
		addr, url = fs.getenv("VALKEYSTREAM_ADDR"), fs.getenv("VALKEYSTREAM_URL")
	}
	var opt *redis.Options
	switch {
	case addr != "" && url != "":
		return nil, usagef("both an address and a URL are given (--addr/VALKEYSTREAM_ADDR and --url/VALKEYSTREAM_URL): give one")
	case url != "":
		var err error
		if opt, err = redis.ParseURL(url); err != nil {
			return nil, usagef("the server URL: %v", err)
		}
	default:
		if addr == "" {
			addr = "127.0.0.1:6379"
		}
		opt = &redis.Options{Addr: addr, DB: fs.db}
	}
	if u := firstNonEmpty(fs.user, fs.getenv("VALKEYSTREAM_USER")); u != "" {
		opt.Username = u
	}
	if p := firstNonEmpty(fs.password, fs.getenv("VALKEYSTREAM_PASSWORD")); p != "" {
		opt.Password = p
	}
	opt.DialTimeout = fs.timeout
	opt.ReadTimeout = fs.timeout
	opt.WriteTimeout = fs.timeout
	opt.MaxRetries = 1
	opt.PoolSize = 4
	return opt, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// env returns what a command runs with.
func (fs *flagSet) env(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) (*env, error) {
	opt, err := fs.options()
	if err != nil {
		return nil, err
	}
	prefix, err := fs.keyPrefix()
	if err != nil {
		return nil, err
	}
	client, err := fs.connect(ctx, opt)
	if err != nil {
		return nil, err
	}
	return &env{
		client: client,
		addr:   opt.Addr,
		prefix: prefix,
		json:   fs.json,
		stdin:  bufio.NewReader(stdin),
		stdout: stdout,
		stderr: stderr,
	}, nil
}

// env is what a command runs with: a client and the terminal.
type env struct {
	client redis.UniversalClient // a *redis.ClusterClient on a cluster
	addr   string
	prefix string // the key prefix of topics
	json   bool
	stdin  *bufio.Reader
	stdout io.Writer
	stderr io.Writer

	lagKnown *bool // whether the server reports a group's lag; nil until asked
}

func (e *env) close() { _ = e.client.Close() }

// serverErr wraps an error of a call to the server with what was being done
// and advice when the server could not be reached.
func (e *env) serverErr(doing string, err error) error {
	var reply redis.Error
	if errors.As(err, &reply) {
		if redis.HasErrorPrefix(err, "NOAUTH") || redis.HasErrorPrefix(err, "WRONGPASS") {
			return fmt.Errorf("%s: %w (give --user and --password, or VALKEYSTREAM_USER and VALKEYSTREAM_PASSWORD)", doing, err)
		}
		if redis.HasErrorPrefix(err, "NOPERM") {
			return fmt.Errorf("%s: %w (the ACL user lacks a permission this command needs)", doing, err)
		}
		return fmt.Errorf("%s: %w", doing, err)
	}
	return fmt.Errorf("%s: cannot reach the server at %s: %w (check --addr or --url, or VALKEYSTREAM_ADDR)", doing, e.addr, err)
}

// confirm asks question on stderr and reads the answer from stdin. It
// returns nil for yes, and an error that says how to skip the question
// otherwise.
func (e *env) confirm(yes bool, question string) error {
	if yes {
		return nil
	}
	fmt.Fprintf(e.stderr, "%s [y/N] ", question)
	line, err := e.stdin.ReadString('\n')
	answer := strings.ToLower(strings.TrimSpace(line))
	if answer == "y" || answer == "yes" {
		return nil
	}
	if err != nil && answer == "" {
		fmt.Fprintln(e.stderr)
		return errors.New("not confirmed: no answer on standard input; pass --yes to run without asking")
	}
	return errors.New("not confirmed; nothing was changed")
}
