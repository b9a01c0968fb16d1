// Package hash computes the two identities of a ComfyUI API-format workflow
// that comfypool works with:
//
//   - [Structure], the routing and failover key. Two workflows with the
//     same structure hash need the same node classes and the same model
//     files wired the same way, so any backend that ran one can run the
//     other. It ignores prompts, seeds, sizes and node ids.
//   - [Exact], the identity of the exact request, for deduplication,
//     idempotency keys and memoisation. Every value counts; only key order,
//     whitespace, string escaping and number spelling do not.
//
// Both return a [Sum], a SHA-256 digest with a lower-case hex String form,
// text marshalling (it can key a JSON object) and [ParseSum]. [StructureOf]
// and [ExactOf] accept a workflow held as a Go map or struct instead of
// JSON bytes. All functions are pure and safe for concurrent use. The
// package uses only the standard library.
//
// # Workflows
//
// An API-format workflow is a JSON object mapping node ids to nodes:
//
//	{"3": {"class_type": "KSampler", "inputs": {"seed": 42, "model": ["4", 0], ...}, "_meta": {"title": "..."}}, ...}
//
// An input value is a link ["<source node id>", <output index>] (exactly
// two elements, a string and a number, as ComfyUI's is_link decides) or a
// literal: a number, string, bool, null, an object such as
// {"__value__": [...]}, or any other list.
//
// # Structure: what it keeps and drops
//
// Structure keeps, for every node: its class_type, the names of all its
// inputs, and for each link the output index and (recursively) the
// structure of the source node; and model file names. It drops node ids,
// _meta, every node key other than class_type and inputs, and the values
// of all other literals: a literal contributes only its input name, so a
// prompt, seed, size, sampler or boolean can change, or change type (a seed
// sent as "42" instead of 42), without changing the hash.
//
// A string literal is kept as a model file name when either
//
//   - its input name selects a model: ckpt_name, config_name, vae_name,
//     lora_name, lora_name_<anything>, control_net_name, controlnet_name,
//     unet_name, clip_name, clip_name<digits>, clip_vision_name,
//     upscale_model_name, model_name, model_path, style_model_name,
//     gligen_name, hypernetwork_name, embedding, photomaker_model_name,
//     audio_encoder_name, ipadapter_file, instantid_file; or
//   - its value ends in a model file extension, compared case-insensitively:
//     .safetensors, .ckpt, .pt, .pth, .bin, .gguf, .onnx, .sft, .pkl.
//
// These are the rules by which package comfy tells a model missing on one
// server from a bad value (comfy.PromptError.MissingOnServer), so that a
// failover block keyed by this hash covers exactly the workflows that need
// the missing model.
//
// The file name is kept byte for byte (case and path separators count),
// because that is what the backend looks up. The second rule also catches
// custom loader nodes with unusual input names, at the price of treating a
// prompt that happens to end in ".pt" as a file name.
//
// A bare list that is not a link ([3, 0] with an integer node id,
// ["a", "b"], a list of three elements) is a literal. ComfyUI rejects it at
// validation, but it says nothing about the graph. A link's output index
// must be a non-negative integer; an integer-valued spelling such as 0.0 or
// 1e0 is accepted and equals 0 or 1.
//
// Structure validates as it hashes and returns an error wrapping
// [ErrInvalidWorkflow] for malformed input (see there), and a [*GraphError]
// with Kind [ErrCycle] or [ErrDanglingLink], naming the nodes involved, for
// a cycle or a link to a missing node. An empty workflow ({}) is invalid. A
// node whose inputs is missing or null is taken as having no inputs, as
// comfy.ParseWorkflow does; inputs of any other non-object type is invalid.
//
// # Structure: renumbering invariance
//
// Structure hashes the graph, not the ids. It is a Merkle hash over the
// DAG, computed iteratively in topological order (Kahn's algorithm, linear
// time, no recursion, so a 10,000-node chain is fine):
//
//	node digest = SHA-256("comfypool/structure/v2/node\x00" ‖ str(class_type) ‖ uvarint(#inputs) ‖ inputs sorted by name)
//	  literal   = 'v' ‖ str(name)
//	  model     = 'm' ‖ str(name) ‖ str(file name)
//	  link      = 'l' ‖ str(name) ‖ uvarint(output index) ‖ source node digest
//	workflow    = SHA-256("comfypool/structure/v2\x00" ‖ uvarint(#nodes) ‖ node digests sorted bytewise)
//
// where str(s) = uvarint(len(s)) ‖ s (UTF-8) and uvarint is
// [encoding/binary.AppendUvarint]. Renaming ids (and rewriting the links
// accordingly) cannot change any digest. Every node counts, not only output
// nodes, and the final set is a multiset: a workflow with two identical
// independent branches differs from one with a single branch.
//
// # Exact
//
// Exact is SHA-256 over "comfypool/exact/v1\x00" followed by a canonical
// JSON encoding of the whole document:
//
//   - objects with keys sorted by their UTF-8 bytes (a repeated key keeps
//     its last value, as ComfyUI's Python decoder does), arrays in order,
//     no whitespace;
//   - strings as their decoded Unicode text, escaping only '"', '\' and
//     control characters (as \u00XX), so "\u00e9" and "é" are equal;
//   - numbers in an exact canonical decimal form, never rounded through
//     float64: 1, 1.0, 1e0 and 10e-1 are equal, -0 equals 0, while
//     18446744073709551615 and 18446744073709551614 differ. An integer of at
//     most 21 digits is written as plain digits, any other number as
//     d[.ddd]e<exponent> (0.5 is 5e-1).
//
// Node ids count in Exact (it is the exact workflow), and so do _meta and
// unknown keys: "every value counts" is simpler to reason about for
// idempotency than a list of exceptions. Exact requires a non-empty JSON
// object in valid UTF-8 with nothing after it, and does not check nodes or
// links.
//
// # Test vectors
//
// The first workflow is a single node; the second is the graph of the real
// ComfyUI transcript (EmptyImage → ImageInvert → SaveImage + PreviewImage):
//
//	{"1":{"class_type":"EmptyImage","inputs":{}}}
//	  Structure d272b576cc61ea8e054596bf7d386d6003520b14881466799e0c1d3c9d7ff11b
//	  Exact     8c706348b107da099369aaee5172cd44d78f5a640eff47957a87f1f4e0ecc0d6
//
//	{"1":{"class_type":"EmptyImage","inputs":{"width":64,"height":48,"batch_size":1,"color":16711680}},
//	 "2":{"class_type":"ImageInvert","inputs":{"image":["1",0]}},
//	 "3":{"class_type":"SaveImage","inputs":{"images":["2",0],"filename_prefix":"comfyreal_test"}},
//	 "4":{"class_type":"PreviewImage","inputs":{"images":["2",0]}}}
//	  Structure eb93b8b32d4ad129d229ee77cf408cc24d82782093aba349ad81008ae60f8fa6
//	  Exact     6aea0a4e99102dd38c1be885436ac1d87b2e7ac2865b902bd430834ebad0ab1e
//
// The package tests pin these and an SD1.5 graph. Any change to what
// either hash covers changes the version in its domain prefix.
package hash
