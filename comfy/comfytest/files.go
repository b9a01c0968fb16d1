package comfytest

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// fileKey names a stored file: type ("input", "output", "temp"),
// subfolder and name.
type fileKey struct{ typ, sub, name string }

var counterRE = regexp.MustCompile(`_(\d{5})_\.png$`)

// saveImages stores one PNG per batch item (at most 64) the way SaveImage
// names them and returns the file records.
func (s *Server) saveImages(typ, prefix string, v *imgVal) []any {
	if prefix == "" {
		prefix = "ComfyUI"
	}
	sub := ""
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		sub, prefix = path.Clean(prefix[:i]), prefix[i+1:]
		if sub == "." {
			sub = ""
		}
	}
	n := v.saved()
	data := make([][]byte, n)
	for i := range data {
		data[i] = s.encodeItem(v, i)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ck := typ + "\x00" + sub + "\x00" + prefix
	next, ok := s.saveCounters[ck]
	if !ok {
		// First save under this prefix: continue after existing files, as
		// SaveImage does by scanning its folder.
		next = 1
		for k := range s.files {
			if k.typ != typ || k.sub != sub || !strings.HasPrefix(k.name, prefix+"_") {
				continue
			}
			if m := counterRE.FindStringSubmatch(k.name); m != nil && len(k.name) == len(prefix)+len(m[0]) {
				n, _ := strconv.Atoi(m[1])
				next = max(next, n+1)
			}
		}
	}
	s.saveCounters[ck] = next + n
	var recs []any
	for i := range n {
		name := fmt.Sprintf("%s_%05d_.png", prefix, next+i)
		s.files[fileKey{typ, sub, name}] = data[i]
		recs = append(recs, omap{{"filename", name}, {"subfolder", sub}, {"type", typ}})
	}
	return recs
}

// tempPrefix is PreviewImage's per-node "ComfyUI_temp_xxxxx" prefix.
func (s *Server) tempPrefix(nodeID, class string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := class + "\x00" + nodeID
	if p, ok := s.tempNames[k]; ok {
		return p
	}
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = 'a' + b[i]%26
	}
	p := "ComfyUI_temp_" + string(b)
	s.tempNames[k] = p
	return p
}

// splitAnnotated handles "sub/name.png [output]".
func splitAnnotated(name, defType string) fileKey {
	typ := defType
	for _, t := range []string{"input", "output", "temp"} {
		if strings.HasSuffix(name, " ["+t+"]") {
			typ = t
			name = strings.TrimSuffix(name, " ["+t+"]")
		}
	}
	sub := ""
	if i := strings.LastIndex(name, "/"); i >= 0 {
		sub, name = name[:i], name[i+1:]
	}
	return fileKey{typ, sub, name}
}

func (s *Server) inputFileExists(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.inputFileLocked(splitAnnotated(name, "input"))
	return ok
}

// inputFileLocked returns the stored file k names: on the Cloud dialect by
// its name alone (content-addressed storage ignores subfolders). Caller
// holds s.mu.
func (s *Server) inputFileLocked(k fileKey) ([]byte, bool) {
	if s.cloud != nil {
		return s.cloudFileLocked(k.typ, k.name)
	}
	data, ok := s.files[k]
	return data, ok
}

func badSubfolder(sub string) bool {
	if sub == "" {
		return false
	}
	c := path.Clean("/" + sub)
	return strings.HasPrefix(sub, "/") || strings.Contains(sub, "..") || c == "/"
}

// handleUpload serves POST /upload/image and /upload/mask.
func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request, mask bool) {
	if err := r.ParseMultipartForm(32 << 20); err != nil {
		emptyStatus(w, http.StatusBadRequest)
		return
	}
	f, hdr, err := r.FormFile("image")
	if err != nil || hdr.Filename == "" {
		emptyStatus(w, http.StatusBadRequest)
		return
	}
	data, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		emptyStatus(w, http.StatusBadRequest)
		return
	}
	typ := r.FormValue("type")
	if typ == "" {
		typ = "input"
	}
	if typ != "input" && typ != "temp" && typ != "output" {
		serverTrouble(w)
		return
	}
	sub := r.FormValue("subfolder")
	if badSubfolder(sub) {
		emptyStatus(w, http.StatusBadRequest)
		return
	}
	if mask {
		var ref struct{ Filename, Subfolder, Type string }
		if err := jsonUnmarshal([]byte(r.FormValue("original_ref")), &ref); err != nil || ref.Filename == "" {
			serverTrouble(w)
			return
		}
		if ref.Type == "" {
			ref.Type = "output"
		}
		s.mu.Lock()
		_, ok := s.files[fileKey{ref.Type, ref.Subfolder, ref.Filename}]
		s.mu.Unlock()
		if !ok {
			emptyStatus(w, http.StatusNotFound)
			return
		}
	}
	name := path.Base(strings.ReplaceAll(hdr.Filename, "\\", "/"))
	overwrite := r.FormValue("overwrite")
	s.mu.Lock()
	if overwrite != "true" && overwrite != "1" {
		ext := path.Ext(name)
		stem := strings.TrimSuffix(name, ext)
		for i := 1; ; i++ {
			old, exists := s.files[fileKey{typ, sub, name}]
			if !exists || bytes.Equal(old, data) {
				break
			}
			name = fmt.Sprintf("%s (%d)%s", stem, i, ext)
		}
	}
	s.files[fileKey{typ, sub, name}] = data
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, omap{{"name", name}, {"subfolder", sub}, {"type", typ}})
}

// handleView serves GET /view. preview= and channel= are ignored: the stored
// bytes are served as they are.
func (s *Server) handleView(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("filename") {
		emptyStatus(w, http.StatusNotFound)
		return
	}
	typ := q.Get("type")
	if typ == "" {
		typ = "output"
	}
	if typ != "output" && typ != "input" && typ != "temp" {
		emptyStatus(w, http.StatusBadRequest)
		return
	}
	filename := q.Get("filename")
	if strings.HasPrefix(filename, "/") || strings.Contains(filename, "..") {
		emptyStatus(w, http.StatusBadRequest)
		return
	}
	k := splitAnnotated(filename, typ)
	sub := q.Get("subfolder")
	if badSubfolder(sub) {
		emptyStatus(w, http.StatusForbidden)
		return
	}
	if sub != "" {
		if k.sub != "" {
			k.sub = sub + "/" + k.sub
		} else {
			k.sub = sub
		}
	}
	s.mu.Lock()
	data, ok := s.files[k]
	s.mu.Unlock()
	if !ok {
		emptyStatus(w, http.StatusNotFound)
		return
	}
	ct := mime.TypeByExtension(path.Ext(k.name))
	if ct == "" || strings.HasPrefix(ct, "text/html") || strings.Contains(ct, "javascript") || strings.HasPrefix(ct, "text/css") {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Disposition", fmt.Sprintf("filename=%q", k.name))
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(data)
	}
}
