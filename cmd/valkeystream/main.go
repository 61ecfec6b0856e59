// Command valkeystream inspects and repairs the streams, consumer groups,
// pending entries, dead letters, delayed messages and deduplication marks
// of valkeystream applications.
//
// Usage:
//
//	valkeystream <command> [flags] [arguments]
//
// Run "valkeystream help" for the commands and "valkeystream <command>
// --help" for one command's flags. The server is given by --addr or --url,
// or by the VALKEYSTREAM_ADDR and VALKEYSTREAM_URL environment variables; a
// cluster is detected, or named with --cluster. Streams are named by topic
// or by stream key; --prefix or VALKEYSTREAM_KEY_PREFIX gives the
// applications' KeyPrefix.
//
// Exit codes: 0 success, 1 failure (the server refused, a key is missing, the
// operator declined), 2 wrong usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// command is one subcommand of the tool.
type command struct {
	name    string // as typed, e.g. "dead replay"
	args    string // the positional arguments, for the usage line
	summary string // one line for the command list
	help    string // paragraphs shown by --help, after the usage line
	// setup registers the command's own flags and returns the function that
	// runs it with the positional arguments.
	setup func(fs *flagSet) func(ctx context.Context, e *env, args []string) error
	nargs [2]int // the least and most positional arguments; -1: no most
}

var commands = []*command{
	streamsCommand,
	groupCommand,
	pendingCommand,
	entryCommand,
	deadListCommand,
	deadReplayCommand,
	pruneCommand,
	delayedListCommand,
	delayedShowCommand,
	delayedCancelCommand,
	dedupShowCommand,
	dedupClearCommand,
	partitionsDeclareCommand, // before partitionsCommand, whose name is its first word
	partitionsCommand,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// usageError is a mistake in the command line; it exits with exitUsage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// run runs the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		if len(args) > 1 {
			if c := findCommand(args[1:]); c != nil {
				fs := newFlagSet(c, stderr, getenv)
				c.setup(fs)
				fs.usage(stdout)
				return exitOK
			}
		}
		printUsage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	c := findCommand(args)
	if c == nil {
		fmt.Fprintf(stderr, "valkeystream: unknown command %q; run \"valkeystream help\" for the list\n", strings.Join(args[:min(2, len(args))], " "))
		return exitUsage
	}
	rest := args[len(strings.Fields(c.name)):]
	fs := newFlagSet(c, stderr, getenv)
	runFn := c.setup(fs)
	positional, err := fs.parse(rest)
	if errors.Is(err, errHelp) {
		fs.usage(stdout)
		return exitOK
	}
	if err == nil {
		err = checkArgs(c, positional)
	}
	if err != nil {
		fmt.Fprintf(stderr, "valkeystream %s: %v\nrun \"valkeystream %s --help\" for usage\n", c.name, err, c.name)
		return exitUsage
	}
	e, err := fs.env(ctx, stdin, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "valkeystream %s: %v\n", c.name, err)
		return exitUsage
	}
	defer e.close()
	if err := runFn(ctx, e, positional); err != nil {
		fmt.Fprintf(stderr, "valkeystream %s: %v\n", c.name, err)
		var u usageError
		if errors.As(err, &u) {
			return exitUsage
		}
		return exitFailure
	}
	return exitOK
}

// findCommand returns the command named by the first one or two words of
// args, or nil.
func findCommand(args []string) *command {
	for _, c := range commands {
		words := strings.Fields(c.name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == c.name {
			return c
		}
	}
	return nil
}

func checkArgs(c *command, args []string) error {
	lo, hi := c.nargs[0], c.nargs[1]
	switch {
	case len(args) < lo:
		return usagef("missing arguments: want %s", c.args)
	case hi >= 0 && len(args) > hi:
		return usagef("too many arguments (%q): want %s", args[hi:], c.args)
	}
	return nil
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `valkeystream inspects and repairs valkeystream streams, consumer groups,
pending entries, dead letters, delayed messages and deduplication marks.

Usage:
  valkeystream <command> [flags] [arguments]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-15s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
The server: --addr host:port or --url redis://user:pass@host:port/db, else
VALKEYSTREAM_ADDR or VALKEYSTREAM_URL, else 127.0.0.1:6379. --user and
--password (or VALKEYSTREAM_USER, VALKEYSTREAM_PASSWORD) authenticate.
A cluster node is detected (INFO cluster) and the whole cluster is used;
--cluster says so without asking, and --addr may then list several nodes.
Tables by default; --json prints JSON for scripts.

Streams are named by topic or by stream key. --prefix shop: (or
VALKEYSTREAM_KEY_PREFIX) gives the KeyPrefix of the application's
Subscribers and Publishers: a name that begins with it is a stream key,
any other name a topic (orders.placed is the stream shop:orders.placed);
--prefix '' names keys outside it. Dead-letter commands take the topic the
dead letters came from as well.

Run "valkeystream <command> --help" for a command's flags.
Exit codes: 0 success, 1 failure, 2 wrong usage.
`)
}
