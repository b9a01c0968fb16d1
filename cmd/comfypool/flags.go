package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// errHelp is returned when -h asked for a command's usage (printed).
var errHelp = flag.ErrHelp

// flagSet is a subcommand's flag.FlagSet with environment variables bound to
// some of its flags: a variable that is set gives the flag's value unless
// the command line gives it too.
type flagSet struct {
	*flag.FlagSet
	usage string // the synopsis and description printed above the flags
	env   []envBinding
	args  []string // the arguments that are not flags
}

type envBinding struct{ flag, variable string }

// newFlagSet returns the flag set of command name; usage is its synopsis
// and description, printed above the flags by -h.
func newFlagSet(name, usage string) *flagSet {
	fs := flag.NewFlagSet("comfypool "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors and usage itself
	return &flagSet{FlagSet: fs, usage: usage}
}

// bindEnv makes environment variable variable set flag name (the command
// line wins), and says so in the flag's usage.
func (f *flagSet) bindEnv(name, variable string) {
	fl := f.Lookup(name)
	if fl == nil {
		panic("comfypool: bindEnv of an undefined flag " + name)
	}
	fl.Usage += " [$" + variable + "]"
	f.env = append(f.env, envBinding{name, variable})
}

// parse sets the bound flags from the environment, then parses args. -h
// prints the usage to e.stdout and returns errHelp; a bad flag or variable
// gives a *usageError.
func (f *flagSet) parse(e *env, args []string) error {
	for _, b := range f.env {
		v := e.getenv(b.variable)
		if v == "" {
			continue
		}
		if err := f.Set(b.flag, v); err != nil {
			return usagef("$%s: %v", b.variable, err)
		}
		if r, ok := f.Lookup(b.flag).Value.(interface{ fromEnv() }); ok {
			r.fromEnv()
		}
	}
	// Flags may follow arguments (run wf.json -count 3): parse again after
	// each argument, until "--", after which all are arguments.
	f.args = nil
	for {
		err := f.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			f.printUsage(e.stdout)
			return errHelp
		case err != nil:
			return usagef("%v", err)
		}
		rest := f.FlagSet.Args()
		if len(rest) == 0 {
			return nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			f.args = append(f.args, rest...)
			return nil
		}
		f.args = append(f.args, rest[0])
		args = rest[1:]
	}
}

// Args returns the arguments that are not flags, after parse.
func (f *flagSet) Args() []string { return f.args }

// NArg returns how many arguments are not flags, after parse.
func (f *flagSet) NArg() int { return len(f.args) }

func (f *flagSet) printUsage(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nFlags:\n", strings.TrimSpace(f.usage))
	f.SetOutput(w)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
}

// listFlag is a repeatable flag whose values may also be comma-separated:
// -server a -server b,c gives [a b c]. Values from the environment are
// replaced, not extended, by the command line's.
type listFlag struct {
	values []string
	env    bool // values came from the environment
}

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(s string) error {
	if l.env {
		l.values, l.env = nil, false
	}
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			l.values = append(l.values, v)
		}
	}
	return nil
}

func (l *listFlag) fromEnv() { l.env = true }

// shareFlag is a float flag limited to [0, 1].
type shareFlag float64

func (s *shareFlag) String() string { return strconv.FormatFloat(float64(*s), 'g', -1, 64) }

func (s *shareFlag) Set(v string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return errors.New("not a number")
	}
	if f < 0 || f > 1 {
		return errors.New("must be between 0 and 1")
	}
	*s = shareFlag(f)
	return nil
}
