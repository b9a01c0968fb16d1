package redisqueue

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The queue's Lua code (lua/*.lua) runs as a Redis Functions library:
// loaded once per server, so that a call runs only its own work. As an
// EVAL script, every call would run its files' definitions again (some
// 50 functions and tables, about 85,000 of Redis's instructions, half a
// lease), since Redis keeps a script compiled but not its state. Where Redis has no Functions (before 7.0, or an ACL that
// forbids them), the same code runs as EVALSHA scripts.

//go:embed lua/*.lua
var luaFiles embed.FS

// scriptNames are the driver's scripts, each the entry point that
// lua/<name>.lua adds to entries (see lua/lib.lua).
var scriptNames = []string{"ops", "enqueue", "tick", "stats", "purge", "workflows", "pause", "reconcile", "settle"}

// libPrefix starts the name of the driver's Functions library; a digest
// of its code ends it.
const libPrefix = "comfypool_redisqueue_"

// luaLib is the driver's Lua code in its two forms.
type luaLib struct {
	name string                   // the library's name: libPrefix and the code's version
	code string                   // the library's source (FUNCTION LOAD)
	fn   map[string]string        // script name -> its function in the library
	eval map[string]*redis.Script // script name -> its EVAL script
}

// lib is the driver's Lua code, built once (it never changes).
var lib = buildLib()

// buildLib builds the library and the scripts from lua/: lib.lua, then
// each script's file in a block of its own (its locals are its own).
// The library is named after a digest of the code, so that a library
// of another version of the driver on the same server keeps its own
// name and functions: processes of two versions run side by side, each
// with its own code, and loading one never replaces the other.
func buildLib() *luaLib {
	read := func(name string) string {
		b, err := luaFiles.ReadFile("lua/" + name + ".lua")
		if err != nil {
			panic(err)
		}
		return string(b)
	}
	common := read("lib")
	files := map[string]string{}
	h := sha1.New()
	h.Write([]byte(common))
	for _, name := range scriptNames {
		files[name] = "do\n" + read(name) + "\nend\n"
		h.Write([]byte(files[name]))
	}
	l := &luaLib{
		name: libPrefix + hex.EncodeToString(h.Sum(nil))[:12],
		fn:   map[string]string{},
		eval: map[string]*redis.Script{},
	}
	var code strings.Builder
	code.WriteString("#!lua name=" + l.name + "\n" + common + "\n")
	for _, name := range scriptNames {
		code.WriteString(files[name])
	}
	for _, name := range scriptNames {
		l.fn[name] = l.name + "_" + name
		code.WriteString("redis.register_function('" + l.fn[name] + "', entries." + name + ")\n")
		l.eval[name] = redis.NewScript(common + "\n" + files[name] + "return entries." + name + "(KEYS, ARGV)\n")
	}
	l.code = code.String()
	return l
}

// call runs the script name on d.keys and args: a function of the
// library (FCALL), loaded first when the server has lost it (a restart
// without persistence, FUNCTION FLUSH, a new node), or the EVALSHA
// script where the server has no Functions, which the first call finds
// out for the Driver's life.
func (d *Driver) call(ctx context.Context, name string, args []any) (any, error) {
	if !d.noFunctions.Load() {
		res, err := d.c.FCall(ctx, lib.fn[name], d.keys, args...).Result()
		if !functionMissing(err) && !functionsUnavailable(err) {
			return res, err
		}
		if functionMissing(err) { // the call ran nothing: load and call again
			if err = d.loadLib(ctx); err == nil {
				return d.c.FCall(ctx, lib.fn[name], d.keys, args...).Result()
			}
			if !functionsUnavailable(err) {
				return nil, err
			}
		}
		d.noFunctions.Store(true)
		reason, _, _ := strings.Cut(err.Error(), ", with args") // not the call's arguments
		d.log.InfoContext(ctx, "redisqueue: no Redis Functions for this client; scripts run with EVALSHA", "reason", reason)
	}
	return lib.eval[name].Run(ctx, d.c, d.keys, args...).Result()
}

// loadLib loads the library (FUNCTION LOAD REPLACE) on the server, or
// on every master of a cluster or shard of a ring, whichever serves the
// queue's slot: a library is one server's.
func (d *Driver) loadLib(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		return c.FunctionLoadReplace(ctx, lib.code).Err()
	}
	switch c := d.c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, load)
	case *redis.Ring:
		return c.ForEachShard(ctx, load)
	default:
		return d.c.FunctionLoadReplace(ctx, lib.code).Err()
	}
}

// functionMissing reports whether err is the reply to an FCALL of a
// function the server does not have.
func functionMissing(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "ERR Function not found")
}

// functionsUnavailable reports whether err is the reply of a server
// without Functions (before 7.0: FCALL or FUNCTION is an unknown
// command) or of one whose ACL denies the connection's user FCALL or
// FUNCTION LOAD.
func functionsUnavailable(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	if strings.HasPrefix(msg, "ERR unknown command") || strings.HasPrefix(msg, "ERR unknown subcommand") {
		return true
	}
	lower := strings.ToLower(msg)
	return strings.HasPrefix(msg, "NOPERM") && (strings.Contains(lower, "'fcall'") || strings.Contains(lower, "'function"))
}
