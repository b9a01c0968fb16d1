package comfy

import "context"

// session owns the WebSocket connection, its reader goroutine, reconnects,
// and the prompts in flight. (Placeholder: being written.)
type session struct{}

func (s *session) init(c *Client)                  {}
func (s *session) close(ctx context.Context) error { return nil }
