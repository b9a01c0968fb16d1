package comfy

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// Credentials never reach an error, a log line or a typed value the client
// returns, whatever a server echoes back and however it encodes it. The
// scrubber knows every credential of a client (computed once, in NewClient)
// and recognises each one written in any mix of the encodings a body or an
// error message can hold:
//
//   - raw bytes;
//   - JSON string escapes: \uXXXX in either case (surrogate pairs
//     included), \/, \", \\, \n and friends, also escaped again
//     (\\u0026 in JSON inside JSON) and Python's \xNN, \UXXXXXXXX and \';
//   - URL encoding: %XX in either case (also %25XX, encoded twice) and +
//     for a space;
//   - HTML entities (&amp;, &lt;, &#38;, &#x26;, ...);
//   - base64 (standard and URL alphabets, with or without padding) of the
//     whole basic-auth "user:pass" and of each credential alone.
//
// A match of the whole credential, or of its first prefixMin characters or
// more (a credential that a server or a cut truncated), becomes "REDACTED".

const (
	// redacted replaces a credential.
	redacted = "REDACTED"
	// minSecret is the shortest credential that is scrubbed: shorter ones
	// would match ordinary text everywhere.
	minSecret = 3
	// prefixMin is the length, in characters, from which a truncated
	// credential (a prefix of it) is scrubbed too.
	prefixMin = 8
	// maxBackslashes bounds the backslashes read before an escape letter
	// (a string escaped three times has 4 before \u).
	maxBackslashes = 8
	// maxUnitEncoding bounds the encoded length of one character of a
	// credential in the forms recognised, for the read margins.
	maxUnitEncoding = 40
)

// scrubber finds and replaces a client's credentials. Its zero value (no
// credentials) returns every text unchanged. It is immutable after
// newScrubber and safe for concurrent use.
type scrubber struct {
	lits  []literal
	start [256]bool // bytes that may begin a match
	// margin is the longest encoded form of a credential, in bytes: a body
	// read this far beyond a cut holds every credential that straddles it.
	margin int
}

// literal is one credential (or an encoding of one that is not matched
// character by character, such as base64), as characters.
type literal struct {
	units []unit
	// padded: a whole match may be followed by base64 padding ("=").
	padded bool
}

// unit is one character of a literal: a rune and its UTF-8 bytes (or a
// single byte of invalid UTF-8, with r utf8.RuneError and byteOnly set).
type unit struct {
	r        rune
	b        string
	byteOnly bool
}

// newScrubber returns a scrubber for values: each value, and each one's
// base64 forms, is recognised in every encoding.
func newScrubber(values ...string) *scrubber {
	s := &scrubber{}
	seen := map[string]bool{}
	add := func(v string, padded bool) {
		if utf8.RuneCountInString(v) < minSecret || seen[v] {
			return
		}
		seen[v] = true
		lit := literal{padded: padded}
		for i := 0; i < len(v); {
			r, n := utf8.DecodeRuneInString(v[i:])
			lit.units = append(lit.units, unit{r: r, b: v[i : i+n], byteOnly: r == utf8.RuneError && n == 1})
			i += n
		}
		s.lits = append(s.lits, lit)
		s.margin = max(s.margin, (len(lit.units)+2)*maxUnitEncoding)
		first := lit.units[0].b[0]
		s.start[first] = true
		if first == ' ' {
			s.start['+'] = true
		}
	}
	for _, v := range values {
		add(v, false)
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			add(enc.EncodeToString([]byte(v)), true)
		}
	}
	if len(s.lits) > 0 {
		s.start['\\'], s.start['%'], s.start['&'] = true, true, true
	}
	return s
}

// secretValues lists the credentials of options o: the password and the
// basic-auth "user:pass", the bearer and query tokens, the Cloud API key,
// the extra header values.
func secretValues(o *ClientOptions) []string {
	out := []string{o.Password, o.BearerToken, o.QueryToken, o.APIKey, o.ComfyOrgAPIKey}
	if o.Username != "" {
		out = append(out, o.Username+":"+o.Password)
	}
	for _, vs := range o.Header {
		out = append(out, vs...)
	}
	return out
}

// scrub returns text with every credential replaced by "REDACTED".
func (s *scrubber) scrub(text string) string {
	if s == nil || len(s.lits) == 0 {
		return text
	}
	var b strings.Builder
	last := 0 // text[last:i] is not yet copied to b
	for i := 0; i < len(text); {
		if !s.start[text[i]] {
			i++
			continue
		}
		end := -1
		c := text[i]
		escape := c == '\\' || c == '%' || c == '&' || c == '+'
		for _, lit := range s.lits {
			if c != lit.units[0].b[0] && !escape {
				continue // cannot start here: a fast path for ordinary text
			}
			if e := lit.matchAt(text, i); e > end {
				end = e
			}
		}
		if end < 0 {
			i++
			continue
		}
		if b.Len() == 0 {
			b.Grow(len(text))
		}
		b.WriteString(text[last:i])
		b.WriteString(redacted)
		i, last = end, end
	}
	if last == 0 {
		return text
	}
	b.WriteString(text[last:])
	return b.String()
}

// scrubCut scrubs text, then cuts it to at most n bytes (on a rune
// boundary). Scrubbing first means a credential straddling the cut is
// recognised whole; text should extend s.margin bytes beyond n for that.
// scrubBytes is scrub for bytes: b itself when there is nothing to
// scrub, without the copies to and from a string.
func (s *scrubber) scrubBytes(b []byte) []byte {
	if s == nil || len(s.lits) == 0 {
		return b
	}
	return []byte(s.scrub(string(b)))
}

func (s *scrubber) scrubCut(text string, n int) string {
	text = s.scrub(text)
	if len(text) <= n {
		return text
	}
	for n > 0 && !utf8.RuneStart(text[n]) {
		n--
	}
	return text[:n]
}

// scrubJSON scrubs a raw JSON value. If the result is no longer valid JSON
// (a credential that spanned its structure), it becomes a JSON string.
func (s *scrubber) scrubJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return raw
	}
	clean := s.scrub(string(raw))
	if clean == string(raw) {
		return raw
	}
	if json.Valid([]byte(clean)) {
		return json.RawMessage(clean)
	}
	b, _ := json.Marshal(clean)
	return b
}

// matchAt returns the end of the longest match of lit (whole, or a prefix
// of at least prefixMin characters) that starts at text[i], or -1. It runs
// the literal as an automaton over the set of positions each character can
// end at, since one character has several encodings.
func (lit literal) matchAt(text string, i int) int {
	var pos, next posSet
	pos.add(i)
	matched, end := 0, -1
	for k, u := range lit.units {
		next.n = 0
		for _, p := range pos.all() {
			u.ends(text, p, &next)
		}
		if next.n == 0 {
			break
		}
		pos = next
		matched = k + 1
		end = max(end, pos.max())
	}
	switch {
	case matched == len(lit.units):
		if lit.padded {
			pad := unit{r: '=', b: "="}
			for range 2 {
				var e posSet
				pad.ends(text, end, &e)
				if e.n == 0 {
					break
				}
				end = e.max()
			}
		}
		return end
	case matched >= prefixMin:
		return end
	}
	return -1
}

// posSet is a small set of text positions, without allocation. The
// encodings of one character end at a few positions at most; more are
// dropped.
type posSet struct {
	n int
	v [8]int
}

func (s *posSet) add(e int) {
	for _, x := range s.v[:s.n] {
		if x == e {
			return
		}
	}
	if s.n < len(s.v) {
		s.v[s.n] = e
		s.n++
	}
}

func (s *posSet) all() []int { return s.v[:s.n] }

func (s *posSet) max() int {
	m := -1
	for _, v := range s.v[:s.n] {
		m = max(m, v)
	}
	return m
}

// ends adds to out every position where an encoding of u that starts at
// text[p] ends.
func (u unit) ends(text string, p int, out *posSet) {
	// Byte by byte: raw, %XX, + for a space, \xNN. This also covers a
	// character written raw.
	var bpos, nb posSet
	bpos.add(p)
	for j := 0; j < len(u.b) && bpos.n > 0; j++ {
		nb.n = 0
		for _, q := range bpos.all() {
			byteEnds(text, q, u.b[j], &nb)
		}
		bpos = nb
	}
	for _, e := range bpos.all() {
		out.add(e)
	}
	if u.byteOnly || p >= len(text) {
		return
	}
	// As a character: backslash escapes and HTML entities.
	switch text[p] {
	case '\\':
		if u.r == '\\' {
			// A backslash, escaped any number of times.
			for q := p; q < len(text) && text[q] == '\\' && q-p < maxBackslashes; q++ {
				out.add(q + 1)
			}
		}
		if r, e, ok := escapeAt(text, p); ok && r == u.r {
			out.add(e)
		}
	case '&':
		if r, e, ok := entityAt(text, p); ok && r == u.r {
			out.add(e)
		}
	}
}

// byteEnds adds where an encoding of byte c starting at text[p] ends.
func byteEnds(text string, p int, c byte, out *posSet) {
	if p >= len(text) {
		return
	}
	switch t := text[p]; {
	case t == c:
		out.add(p + 1)
		if c != '%' && c != '\\' {
			return
		}
	case t == '+':
		if c == ' ' {
			out.add(p + 1)
		}
		return
	case t != '%' && t != '\\':
		return
	}
	if text[p] == '%' {
		// %XX, or %25XX, %2525XX (encoded again).
		for q, n := p+1, 0; n < 4 && q+2 <= len(text); n++ {
			// A space may also be a '+' that was encoded again.
			if v, ok := hexVal(text[q : q+2]); ok && (byte(v) == c || c == ' ' && v == '+') {
				out.add(q + 2)
			}
			if text[q:q+2] != "25" {
				break
			}
			q += 2
		}
		return
	}
	// Python's bytes repr: \xNN, escaped any number of times.
	q := p
	for q < len(text) && text[q] == '\\' && q-p < maxBackslashes {
		q++
	}
	if q+3 <= len(text) && text[q] == 'x' {
		if v, ok := hexVal(text[q+1 : q+3]); ok && byte(v) == c {
			out.add(q + 3)
		}
	}
}

// escapeAt decodes a backslash escape at text[p] (after any number of
// backslashes, for text escaped several times): \uXXXX (a surrogate pair
// as two), \UXXXXXXXX, \xNN, \n \t \r \b \f, and \ before / " ' `.
func escapeAt(text string, p int) (rune, int, bool) {
	q := p
	for q < len(text) && text[q] == '\\' && q-p < maxBackslashes {
		q++
	}
	if q == p || q >= len(text) {
		return 0, 0, false
	}
	switch c := text[q]; c {
	case 'u':
		v, ok := hexVal(text[q+1 : min(q+5, len(text))])
		if !ok || len(text) < q+5 {
			return 0, 0, false
		}
		r, end := rune(v), q+5
		if r >= 0xD800 && r < 0xDC00 { // high surrogate: the low one follows
			lo, e, ok := escapeAt(text, end)
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return 0, 0, false
			}
			return (r-0xD800)<<10 + (lo - 0xDC00) + 0x10000, e, true
		}
		return r, end, true
	case 'U':
		if len(text) < q+9 {
			return 0, 0, false
		}
		v, ok := hexVal(text[q+1 : q+9])
		return rune(v), q + 9, ok
	case 'x':
		if len(text) < q+3 {
			return 0, 0, false
		}
		v, ok := hexVal(text[q+1 : q+3])
		return rune(v), q + 3, ok
	case 'n':
		return '\n', q + 1, true
	case 't':
		return '\t', q + 1, true
	case 'r':
		return '\r', q + 1, true
	case 'b':
		return '\b', q + 1, true
	case 'f':
		return '\f', q + 1, true
	case '/', '"', '\'', '`':
		return rune(c), q + 1, true
	}
	return 0, 0, false
}

// htmlEntities are the named entities of characters credentials hold.
var htmlEntities = map[string]rune{"amp": '&', "lt": '<', "gt": '>', "quot": '"', "apos": '\'', "sol": '/', "plus": '+', "equals": '=', "nbsp": ' '}

// entityAt decodes an HTML entity at text[p]: &name;, &#NN; or &#xHH;.
func entityAt(text string, p int) (rune, int, bool) {
	if p >= len(text) || text[p] != '&' {
		return 0, 0, false
	}
	semi := strings.IndexByte(text[p:min(len(text), p+12)], ';')
	if semi < 2 {
		return 0, 0, false
	}
	body, end := text[p+1:p+semi], p+semi+1
	if num, ok := strings.CutPrefix(body, "#"); ok {
		if hex, ok := strings.CutPrefix(strings.ToLower(num), "x"); ok {
			v, ok := hexVal(hex)
			return rune(v), end, ok
		}
		v := 0
		for i := 0; i < len(num); i++ {
			if num[i] < '0' || num[i] > '9' {
				return 0, 0, false
			}
			v = v*10 + int(num[i]-'0')
		}
		return rune(v), end, num != ""
	}
	r, ok := htmlEntities[body]
	return r, end, ok
}

// hexVal parses 1 to 8 hex digits.
func hexVal(s string) (int, bool) {
	if s == "" || len(s) > 8 {
		return 0, false
	}
	v := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case '0' <= c && c <= '9':
			v = v<<4 | int(c-'0')
		case 'a' <= c && c <= 'f':
			v = v<<4 | int(c-'a'+10)
		case 'A' <= c && c <= 'F':
			v = v<<4 | int(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// redactedError is an error whose message held a credential: it carries
// the scrubbed message and the scrubbed rest of the chain, so that
// errors.Is and errors.As still find clean causes (context errors,
// net.Error) while no layer that quoted a credential stays reachable.
type redactedError struct {
	msg string
	err error // the redacted cause, or nil
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactedNetError is a redactedError for a layer that was a net.Error, so
// that timeouts stay recognisable.
type redactedNetError struct {
	redactedError
	timeout bool
}

func (e *redactedNetError) Timeout() bool   { return e.timeout }
func (e *redactedNetError) Temporary() bool { return false }

// redactedJoin is a redactedError for a layer with several causes.
type redactedJoin struct {
	msg  string
	errs []error
}

func (e *redactedJoin) Error() string   { return e.msg }
func (e *redactedJoin) Unwrap() []error { return e.errs }

// redact returns err with every credential removed from its message and
// from every error in its chain: a layer whose message is clean (and whose
// causes are) is kept as is; another is replaced by a redacted copy. Each
// of urls (a request URL with its query token) is first replaced by base.
func (s *scrubber) redact(err error, base string, urls ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := msg
	for _, u := range urls {
		if u != "" {
			clean = strings.ReplaceAll(clean, u, base)
		}
	}
	clean = s.scrub(clean)
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		causes := u.Unwrap()
		changed := clean != msg
		out := make([]error, len(causes))
		for i, c := range causes {
			out[i] = s.redact(c, base, urls...)
			changed = changed || out[i] != c
		}
		if !changed {
			return err
		}
		return &redactedJoin{msg: clean, errs: out}
	case interface{ Unwrap() error }:
		cause := u.Unwrap()
		rc := s.redact(cause, base, urls...)
		if clean == msg && rc == cause {
			return err
		}
		return newRedacted(err, clean, rc)
	}
	if clean == msg {
		return err
	}
	return newRedacted(err, clean, nil)
}

func newRedacted(orig error, msg string, cause error) error {
	if t, ok := orig.(interface{ Timeout() bool }); ok {
		return &redactedNetError{redactedError{msg, cause}, t.Timeout()}
	}
	return &redactedError{msg: msg, err: cause}
}

// scrubMessage removes credentials, in place, from the server's text in the
// messages that become errors: execution_error (message, type, traceback,
// inputs, ...) and execution_interrupted. m must not be shared yet.
func (c *Client) scrubMessage(m Message) {
	switch m := m.(type) {
	case *ExecutionError:
		for _, p := range []*string{&m.PromptID, &m.NodeID, &m.NodeType, &m.ExceptionType, &m.ExceptionMessage} {
			*p = c.scrub(*p)
		}
		c.scrubStrings(m.Traceback)
		c.scrubStrings(m.Executed)
		c.scrubStrings(m.CurrentOutputs)
		if len(m.CurrentInputs) > 0 {
			in := make(map[string]json.RawMessage, len(m.CurrentInputs))
			for k, v := range m.CurrentInputs {
				in[c.scrub(k)] = c.secrets.scrubJSON(v)
			}
			m.CurrentInputs = in
		}
	case *ExecutionInterrupted:
		for _, p := range []*string{&m.PromptID, &m.NodeID, &m.NodeType} {
			*p = c.scrub(*p)
		}
		c.scrubStrings(m.Executed)
	}
}

// scrubEntry removes credentials, in place, from the parts of a history
// entry that become errors (see [HistoryEntry.Err]).
func (c *Client) scrubEntry(e *HistoryEntry) {
	e.PromptID = c.scrub(e.PromptID)
	if e.Status != nil {
		for _, m := range e.Status.Messages {
			c.scrubMessage(m)
		}
	}
}

func (c *Client) scrubStrings(s []string) {
	for i := range s {
		s[i] = c.scrub(s[i])
	}
}

// badResponse is the package's badResponse with the detail (which may
// quote the server's answer) scrubbed.
func (c *Client) badResponse(op, detail string) error {
	return badResponse(op, c.scrub(detail))
}
