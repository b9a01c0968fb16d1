package comfytest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// apiError is the {type, message, details, extra_info} object.
func apiError(typ, msg, details string, extra omap) omap {
	if extra == nil {
		extra = omap{}
	}
	return omap{{"type", typ}, {"message", msg}, {"details", details}, {"extra_info", extra}}
}

// missingNodeType is 2026 master's error for a node without a known
// class_type: the node is named by its _meta.title, or "ID #<id>".
func missingNodeType(id string, node omap, classType any, what string) omap {
	var title any
	if meta, ok := node.get("_meta"); ok {
		if mm, ok := meta.(omap); ok {
			title, _ = mm.get("title")
		}
	}
	name := "ID #" + id
	if t, ok := title.(string); ok && t != "" {
		name = t
	}
	return apiError("missing_node_type", fmt.Sprintf("Node '%s' %s", name, what), fmt.Sprintf("Node ID '#%s'", id),
		omap{{"node_id", id}, {"class_type", classType}, {"node_title", title}})
}

type validator struct {
	s         *Server
	nodes     map[string]*nodeDef // the registry the prompt is validated against
	prompt    omap
	validated map[string]*vresult
}

type vresult struct {
	ok      bool
	reasons []any
}

// validatePrompt mirrors execution.validate_prompt. It coerces widget values
// in place. It returns the top-level error (nil when at least one output is
// valid), the good outputs and node_errors.
func (s *Server) validatePrompt(nodes map[string]*nodeDef, prompt omap, partial []string) (omap, []string, omap) {
	var outputs []string
	for _, e := range prompt {
		m, isObj := e.V.(omap)
		ct, has := m.get("class_type")
		if !isObj || !has {
			if s.opts.Dialect.MissingNodeType {
				return missingNodeType(e.K, m, nil, "has no class_type. The workflow may be corrupted or a custom node is missing."), nil, omap{}
			}
			return apiError("invalid_prompt", "Cannot execute because a node is missing the class_type property.", fmt.Sprintf("Node ID '#%s'", e.K), nil), nil, omap{}
		}
		class, _ := ct.(string)
		d := nodes[class]
		if d == nil {
			if s.opts.Dialect.MissingNodeType {
				return missingNodeType(e.K, m, ct, "not found. The custom node may not be installed."), nil, omap{}
			}
			return apiError("invalid_prompt", fmt.Sprintf("Cannot execute because node %s does not exist.", pyStr(ct)), fmt.Sprintf("Node ID '#%s'", e.K), nil), nil, omap{}
		}
		if d.OutputNode && (partial == nil || contains(partial, e.K)) {
			outputs = append(outputs, e.K)
		}
	}
	if len(outputs) == 0 {
		return apiError("prompt_no_outputs", "Prompt has no outputs", "", nil), nil, omap{}
	}
	v := &validator{s: s, nodes: nodes, prompt: prompt, validated: map[string]*vresult{}}
	var good []string
	var errLines []string
	nodeErrors := omap{}
	for _, o := range numDesc(outputs) {
		ok, ex := v.validateNode(o, 0)
		if ok {
			good = append(good, o)
			continue
		}
		var reasons []any
		if ex != nil {
			reasons = []any{ex}
			v.validated[o] = &vresult{ok: false, reasons: reasons}
		} else {
			reasons = v.validated[o].reasons
		}
		for _, rr := range reasons {
			m := rr.(omap)
			msg, _ := m.get("message")
			det, _ := m.get("details")
			errLines = append(errLines, fmt.Sprintf("%v: %v", msg, det))
		}
		for _, e := range prompt {
			res := v.validated[e.K]
			if res == nil || res.ok || len(res.reasons) == 0 {
				continue
			}
			ne, exists := nodeErrors.get(e.K)
			if !exists {
				ne = omap{{"errors", res.reasons}, {"dependent_outputs", []any{}}, {"class_type", nodeClass(e.V)}}
			}
			m := ne.(omap)
			deps, _ := m.get("dependent_outputs")
			m.set("dependent_outputs", append(deps.([]any), o))
			nodeErrors.set(e.K, m)
		}
	}
	if len(good) == 0 {
		return apiError("prompt_outputs_failed_validation", "Prompt outputs failed validation", strings.Join(errLines, "\n"), nil), nil, nodeErrors
	}
	return nil, good, nodeErrors
}

// validateNode mirrors validate_inputs. A non-nil omap is an exception
// (exception_during_validation) that fails the whole output.
func (v *validator) validateNode(id string, depth int) (bool, omap) {
	if r, ok := v.validated[id]; ok {
		return r.ok, nil
	}
	node, ok := v.prompt.get(id)
	if !ok || depth > len(v.prompt)+1 {
		return false, apiError("exception_during_validation", "Exception when validating node", "'"+id+"'",
			omap{{"exception_type", "KeyError"}, {"traceback", []any{
				"  File \"<comfyui>/execution.py\", line 1010, in validate_prompt\n    m = await validate_inputs(prompt_id, prompt, o, validated)\n        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
				"  File \"<comfyui>/execution.py\", line 788, in validate_inputs\n    o_class_type = prompt[o_id]['class_type']\n                   ~~~~~~^^^^^^\n"}}})
	}
	d := v.nodes[nodeClass(node)]
	inputs := nodeInputs(node)
	if inputs == nil {
		inputs = omap{}
	}
	valid := true
	var errs []any
	if d.Inputs == nil {
		// Accept anything; still walk links.
		for _, e := range inputs {
			if src, _, ok := isLink(e.V); ok {
				ok2, ex := v.validateNode(src, depth+1)
				if ex != nil {
					return false, ex
				}
				if !ok2 {
					valid = false
				}
			}
		}
	}
	customIn := map[string]any{}
	for _, spec := range d.Inputs {
		val, present := inputs.get(spec.Name)
		cfg := func() any { return d.inputConfig(spec) } // only errors need it
		if !present {
			if spec.Required {
				errs = append(errs, apiError("required_input_missing", "Required input is missing", spec.Name, omap{{"input_name", spec.Name}}))
			}
			continue
		}
		if m, ok := val.(omap); ok {
			if inner, ok := m.get("__value__"); ok {
				val = inner
				inputs.set(spec.Name, val)
			}
		}
		if arr, ok := val.([]any); ok {
			if len(arr) != 2 {
				errs = append(errs, apiError("bad_linked_input", "Bad linked input, must be a length-2 list of [node_id, slot_index]", spec.Name,
					omap{{"input_name", spec.Name}, {"input_config", cfg()}, {"received_value", val}}))
				continue
			}
			src, slot, isL := isLink(arr)
			if !isL {
				srcKey := pyStr(arr[0])
				return false, apiError("exception_during_validation", "Exception when validating node", "'"+srcKey+"'",
					omap{{"exception_type", "KeyError"}, {"traceback", []any{}}})
			}
			srcNode, exists := v.prompt.get(src)
			if !exists {
				_, ex := v.validateNode(src, depth+1)
				return false, ex
			}
			sd := v.nodes[nodeClass(srcNode)]
			if sd.Outputs != nil {
				if slot < 0 || slot >= len(sd.Outputs) {
					return false, apiError("exception_during_validation", "Exception when validating node", "tuple index out of range",
						omap{{"exception_type", "IndexError"}, {"traceback", []any{}}})
				}
				rt := sd.Outputs[slot]
				if spec.Type != "*" && rt != "*" && rt != spec.Type && !(spec.Type == "COMBO" && rt == "COMBO") {
					errs = append(errs, apiError("return_type_mismatch", "Return type mismatch between linked nodes", fmt.Sprintf("%s, received_type(%s) mismatch input_type(%s)", spec.Name, rt, spec.Type),
						omap{{"input_name", spec.Name}, {"input_config", cfg()}, {"received_type", rt}, {"linked_node", val}}))
					continue
				}
			}
			ok2, ex := v.validateNode(src, depth+1)
			if ex != nil {
				return false, ex
			}
			if !ok2 {
				valid = false
			}
			continue
		}
		// Widget value: coerce as the server does.
		var conv any
		var cerr error
		switch spec.Type {
		case "INT":
			conv, cerr = pyInt(val)
		case "FLOAT":
			conv, cerr = pyFloatOf(val)
		case "STRING":
			conv = pyStr(val)
		case "BOOLEAN":
			conv = pyBool(val)
		default:
			conv = val
		}
		if cerr != nil {
			errs = append(errs, apiError("invalid_input_type", "Failed to convert an input value to a "+spec.Type+" value",
				fmt.Sprintf("%s, %s, %s", spec.Name, pyStr(val), cerr.Error()),
				omap{{"input_name", spec.Name}, {"input_config", cfg()}, {"received_value", val}, {"exception_message", cerr.Error()}}))
			continue
		}
		inputs.set(spec.Name, conv)
		customIn[spec.Name] = conv
		if spec.Type == "INT" || spec.Type == "FLOAT" {
			f := toF(conv)
			if spec.Min != nil && f < *spec.Min {
				errs = append(errs, apiError("value_smaller_than_min", fmt.Sprintf("Value %s smaller than min of %s", pyStr(conv), numStr(spec, *spec.Min)), spec.Name,
					omap{{"input_name", spec.Name}, {"input_config", cfg()}, {"received_value", conv}}))
				continue
			}
			if spec.Max != nil && f > *spec.Max {
				errs = append(errs, apiError("value_bigger_than_max", fmt.Sprintf("Value %s bigger than max of %s", pyStr(conv), numStr(spec, *spec.Max)), spec.Name,
					omap{{"input_name", spec.Name}, {"input_config", cfg()}, {"received_value", conv}}))
				continue
			}
		}
		if spec.Type == "COMBO" && !contains(d.validatedKeys, spec.Name) {
			s, isStr := conv.(string)
			if !isStr || !contains(spec.Options, s) {
				var listInfo string
				var icfg any // none for long lists, as the real server
				if len(spec.Options) > 20 {
					listInfo = fmt.Sprintf("(list of length %d)", len(spec.Options))
				} else {
					icfg = cfg()
					q := make([]string, len(spec.Options))
					for i, o := range spec.Options {
						q[i] = pyRepr(o)
					}
					listInfo = "[" + strings.Join(q, ", ") + "]"
				}
				errs = append(errs, apiError("value_not_in_list", "Value not in list", fmt.Sprintf("%s: '%s' not in %s", spec.Name, pyStr(conv), listInfo),
					omap{{"input_name", spec.Name}, {"input_config", icfg}, {"received_value", conv}}))
			}
		}
	}
	if d.validate != nil && len(errs) == 0 {
		if name, msg := d.validate(v.s, customIn); msg != "" {
			errs = append(errs, apiError("custom_validation_failed", "Custom validation failed for node", name+" - "+msg, omap{{"input_name", name}}))
		}
	}
	good := valid && len(errs) == 0
	if errs == nil {
		errs = []any{}
	}
	v.validated[id] = &vresult{ok: good, reasons: errs}
	return good, nil
}

// inputConfig renders the [type, {opts}] spec used in error extra_info.
func (d *nodeDef) inputConfig(spec InputSpec) any {
	info := d.objectInfo("")
	input, _ := info.get("input")
	for _, sect := range []string{"required", "optional"} {
		m, _ := input.(omap).get(sect)
		if mm, ok := m.(omap); ok {
			if v, ok := mm.get(spec.Name); ok {
				return v
			}
		}
	}
	return nil
}

func numStr(spec InputSpec, f float64) string {
	switch {
	case spec.Type == "FLOAT":
		return pyFloatString(f)
	case f >= 1<<64: // 0xffffffffffffffff, the seed inputs' max, as float64
		return "18446744073709551615"
	case f >= 1<<63:
		return strconv.FormatUint(uint64(f), 10)
	}
	return strconv.FormatInt(int64(f), 10)
}

func toF(v any) float64 {
	switch t := v.(type) {
	case int64:
		return float64(t)
	case uint64:
		return float64(t)
	case *big.Int:
		// Beyond uint64 and int64: past every bound an input declares
		// (as float64, 2^64-1 rounds to 2^64).
		return math.Inf(t.Sign())
	case pyFloat:
		return float64(t)
	}
	return 0
}

// pyInt is Python's int(v) for JSON values: an int64, or for integers
// beyond it (seeds up to 2^64-1) a uint64 or a *big.Int.
func pyInt(v any) (any, error) {
	switch t := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(t.String(), 10, 64); err == nil {
			return i, nil
		}
		if b, ok := new(big.Int).SetString(t.String(), 10); ok {
			if b.IsUint64() {
				return b.Uint64(), nil
			}
			return b, nil
		}
		f, err := t.Float64()
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("cannot convert float %s to integer", t.String())
		}
		return int64(f), nil
	case bool:
		if t {
			return int64(1), nil
		}
		return int64(0), nil
	case string:
		i, err := strconv.ParseInt(strings.TrimSpace(strings.ReplaceAll(t, "_", "")), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("invalid literal for int() with base 10: %s", pyRepr(t))
		}
		return i, nil
	case nil:
		return nil, fmt.Errorf("int() argument must be a string, a bytes-like object or a real number, not 'NoneType'")
	}
	return nil, fmt.Errorf("int() argument must be a string, a bytes-like object or a real number, not 'dict'")
}

// pyFloatOf is Python's float(v) for JSON values.
func pyFloatOf(v any) (any, error) {
	switch t := v.(type) {
	case json.Number:
		f, err := t.Float64()
		if err != nil {
			return nil, fmt.Errorf("could not convert string to float: %s", pyRepr(t.String()))
		}
		return pyFloat(f), nil
	case bool:
		if t {
			return pyFloat(1), nil
		}
		return pyFloat(0), nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
		if err != nil {
			return nil, fmt.Errorf("could not convert string to float: %s", pyRepr(t))
		}
		return pyFloat(f), nil
	case nil:
		return nil, fmt.Errorf("float() argument must be a string or a real number, not 'NoneType'")
	}
	return nil, fmt.Errorf("float() argument must be a string or a real number, not 'dict'")
}

// pyBool is Python's bool(v): beware bool("false") is True.
func pyBool(v any) bool {
	switch t := v.(type) {
	case bool:
		return t
	case json.Number:
		f, _ := t.Float64()
		return f != 0
	case string:
		return t != ""
	case nil:
		return false
	case omap:
		return len(t) > 0
	}
	return true
}
