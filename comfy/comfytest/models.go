package comfytest

import "slices"

// modelKey names what a node with a LoadDelay loads, for Options.ModelSlots:
// its class plus its model-file inputs (string inputs whose name ends in
// "_name", such as ckpt_name or lora_name), so two checkpoints are two
// models.
func modelKey(class string, in map[string]any) string {
	var names []string
	for k := range in {
		if len(k) > 5 && k[len(k)-5:] == "_name" {
			if v, ok := in[k].(string); ok {
				names = append(names, k+"="+v)
			}
		}
	}
	slices.Sort(names)
	key := class
	for _, n := range names {
		key += "\x00" + n
	}
	return key
}

// loadModelLocked reports whether running a node of class with inputs in
// must pay its LoadDelay, and records the model as loaded. With
// Options.ModelSlots 0 a class pays once (until Restart or /free); with
// ModelSlots n at most n models stay loaded and the least recently used is
// evicted. Caller holds s.mu.
func (s *Server) loadModelLocked(class string, in map[string]any) bool {
	slots := s.opts.ModelSlots
	if slots <= 0 {
		paid := s.loaded[class]
		s.loaded[class] = true
		return !paid
	}
	key := modelKey(class, in)
	// s.loaded is the set (Restart and /free reset it); s.modelLRU its
	// order, least recently used first, pruned of keys no longer loaded.
	s.modelLRU = slices.DeleteFunc(s.modelLRU, func(k string) bool { return !s.loaded[k] || k == key })
	hit := s.loaded[key]
	s.modelLRU = append(s.modelLRU, key)
	s.loaded[key] = true
	for len(s.modelLRU) > slots {
		delete(s.loaded, s.modelLRU[0])
		s.modelLRU = s.modelLRU[1:]
	}
	return !hit
}
