// Command fpmbus moves Dynamo's forward-pass metrics from ZMQ onto NATS JetStream and turns them into
// traces, gap events, merged benchmark artefacts and sealed datasets. Run `fpmbus help` for commands.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/fpmbus/fpmbus/internal/flaghelp"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/internal/upstack"
)

// command is one subcommand. run gets the arguments after the command name and returns an error to
// print; errUsage (wrapped), upstack.ErrUsage from a component of `up` or an invalid.FlagError (a flag's
// or a variable's value refused) makes main exit 2 instead of 1.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

// errUsage marks errors caused by how the command was called (bad flag or value): exit status 2.
var errUsage = errors.New("usage")

// exitCoder lets a command choose its own exit status (e.g. a partial publication).
type exitCoder interface{ ExitCode() int }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(runMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...) // the habit of most command-line tools
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "fpmbus: unknown command %q", args[0])
		if s := suggestCommand(args[0]); s != "" {
			fmt.Fprintf(stderr, "; did you mean %q?", s)
		}
		fmt.Fprintln(stderr, " (`fpmbus help` lists the commands)")
		return 2
	}
	level, err := logLevel()
	if err != nil {
		fmt.Fprintf(stderr, "fpmbus %s: %v\n", c.name, err)
		return 2
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))
	err = c.run(ctx, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintf(stderr, "fpmbus %s: %v\n", c.name, err)
	var ec exitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	if fe := (*invalid.FlagError)(nil); errors.Is(err, errUsage) || errors.Is(err, upstack.ErrUsage) || errors.As(err, &fe) {
		return 2
	}
	return 1
}

// suggestCommand returns the command nearest to name, "" when none is close.
func suggestCommand(name string) string {
	best, bestD := "", 0
	for n := range commands {
		if d := flaghelp.EditDistance(name, n); best == "" || d < bestD || d == bestD && n < best {
			best, bestD = n, d
		}
	}
	if bestD > max(2, len(name)/3) {
		return ""
	}
	return best
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fpmbus <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun `fpmbus <command> -h` for a command's flags.")
}

// writeJSON writes v as indented JSON: every command's --json output.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
