package comfy

import "strconv"

// State is the state of a Client's WebSocket connection, as reported by
// [Client.State]. Watch it with [Client.StateChanged].
type State int

// Connection states.
const (
	// StateIdle: the connection was never started (no Connect or Submit yet).
	StateIdle State = iota
	// StateConnecting: the first connection attempt is under way.
	StateConnecting
	// StateConnected: the WebSocket is open and read.
	StateConnected
	// StateReconnecting: the connection dropped; reconnect attempts are under way.
	StateReconnecting
	// StateOffline: several consecutive connection attempts failed. The
	// client keeps retrying in the background (with backoff) until Close.
	StateOffline
	// StateClosed: Close was called. This state is final.
	StateClosed
)

// offlineAfter is the number of consecutive failed connection attempts
// after which the state becomes StateOffline.
const offlineAfter = 3

// String returns the state's lower-case name ("connected", ...).
func (s State) String() string {
	switch s {
	case StateIdle:
		return "idle"
	case StateConnecting:
		return "connecting"
	case StateConnected:
		return "connected"
	case StateReconnecting:
		return "reconnecting"
	case StateOffline:
		return "offline"
	case StateClosed:
		return "closed"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}
