package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1 // a job failed, no backend was reachable, or another error while running
	exitUsage  = 2 // bad flags, arguments or input files
)

// command is one subcommand: a line in the table of commands.
type command struct {
	name    string
	summary string
	// run parses the subcommand's arguments (-h prints its usage to
	// stdout and returns flag.ErrHelp) and runs it until it ends or ctx
	// does.
	run func(ctx context.Context, e *env, args []string) error
}

// commands is the table of subcommands, in the order help lists them. A new
// subcommand is a file with its run function and a line here.
func commands() []command {
	return []command{
		{"fake", "serve fake ComfyUI servers (comfytest) on local ports", runFake},
		{"run", "run a workflow, or a batch of it, across ComfyUI servers", runRun},
		{"bench", "run the benchmark suite (beside a peer library) and print one table", runBench},
	}
}

// env is what a command reads and writes besides its arguments, so that
// tests can give their own.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// terminal is set when stdout is a terminal: run then draws progress
	// bars instead of log lines.
	terminal bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, terminal: isTerminal(os.Stdout)}
	code := runMain(ctx, e, os.Args[1:])
	stop()
	os.Exit(code)
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// runMain runs the command args name and returns the exit status.
func runMain(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 {
		printUsage(e.stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			printUsage(e.stdout)
			return exitOK
		}
		name, rest = rest[0], []string{"-h"}
	}
	var cmd *command
	for _, c := range commands() {
		if c.name == name {
			cmd = &c
			break
		}
	}
	if cmd == nil {
		fmt.Fprintf(e.stderr, "comfypool: unknown command %q\n\n", name)
		printUsage(e.stderr)
		return exitUsage
	}
	err := cmd.run(ctx, e, rest)
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.Is(err, errReported):
		return exitFailed
	case ctx.Err() != nil: // SIGINT or SIGTERM
		fmt.Fprintf(e.stderr, "comfypool %s: interrupted\n", cmd.name)
		return exitFailed
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "comfypool %s: %v\n", cmd.name, ue.err)
		if ue.hint {
			fmt.Fprintf(e.stderr, "Run 'comfypool %s -h' for usage.\n", cmd.name)
		}
		return exitUsage
	default:
		fmt.Fprintf(e.stderr, "comfypool %s: %v\n", cmd.name, err)
		return exitFailed
	}
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, "comfypool runs ComfyUI work across many servers, and fakes them.\n\nUsage:\n\n\tcomfypool <command> [flags] [arguments]\n\nCommands:\n\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "\t%-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'comfypool help <command>' or 'comfypool <command> -h' for a command's flags.\n")
}

// errReported is returned by a command that has already said what went
// wrong (a summary with failed jobs): exit status 1, nothing more printed.
var errReported = errors.New("comfypool: failure reported")

// usageError is bad input from the user (flags, arguments, files): exit
// status 2.
type usageError struct {
	err  error
	hint bool // point at -h
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a *usageError that points at -h.
func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...), hint: true}
}

// badInput returns a *usageError for an input file that cannot be used.
func badInput(err error) error { return &usageError{err: err} }
