package hash_test

import (
	"errors"
	"fmt"

	"github.com/comfypool/comfypool/hash"
)

// Two requests for the same graph with different node ids, prompt and seed
// share a structure hash, so they route to the same backends; a different
// checkpoint does not.
func ExampleStructure() {
	a := []byte(`{
	  "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}},
	  "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["1", 1]}},
	  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "cat"}}
	}`)
	b := []byte(`{
	  "30": {"class_type": "SaveImage", "inputs": {"images": ["20", 0], "filename_prefix": "dog"}},
	  "20": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["10", 1], "text": "a dog"}},
	  "10": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}}
	}`)
	c := []byte(`{
	  "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd_xl_base_1.0.safetensors"}},
	  "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["1", 1]}},
	  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "cat"}}
	}`)
	sa, _ := hash.Structure(a)
	sb, _ := hash.Structure(b)
	sc, _ := hash.Structure(c)
	fmt.Println("renumbered, other prompt:", sa == sb)
	fmt.Println("other checkpoint:", sa == sc)

	_, err := hash.Structure([]byte(`{"1": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}}}`))
	fmt.Println(errors.Is(err, hash.ErrDanglingLink), err)
	// Output:
	// renumbered, other prompt: true
	// other checkpoint: false
	// true hash: dangling link: node "1" input "image" links to missing node "2"
}

// The exact hash ignores formatting and number spelling but not values:
// it identifies a resubmission of the very same workflow.
func ExampleExact() {
	a, _ := hash.Exact([]byte(`{"3": {"class_type": "KSampler", "inputs": {"seed": 42, "cfg": 8.0}}}`))
	b, _ := hash.Exact([]byte(`{"3":{"inputs":{"cfg":8,"seed":4.2e1},"class_type":"KSampler"}}`))
	c, _ := hash.Exact([]byte(`{"3": {"class_type": "KSampler", "inputs": {"seed": 43, "cfg": 8.0}}}`))
	fmt.Println("same workflow, other formatting:", a == b)
	fmt.Println("other seed:", a == c)
	fmt.Println(a)
	// Output:
	// same workflow, other formatting: true
	// other seed: false
	// 4f9fae3a920731f43a74e2868bb57f6207f85563b90ec9ce8174957d71dfad05
}
