package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/comfypool/comfypool/queue"
)

func TestCapabilities(t *testing.T) {
	t.Parallel()
	a := queue.NewCapabilities([]string{"class:X", "list:X/ckpt", "", "value:X/ckpt=a", "class:X"})
	b := queue.NewCapabilities([]string{"value:X/ckpt=a", "list:X/ckpt", "class:X"})
	c := queue.NewCapabilities([]string{"class:X", "list:X/ckpt"})
	assert.Equal(t, []string{"class:X", "list:X/ckpt", "value:X/ckpt=a"}, a.Items(), "sorted, deduplicated, no empty item")
	assert.Equal(t, 3, a.Len())
	assert.Equal(t, a.Digest(), b.Digest(), "equal content, equal digest")
	assert.NotEqual(t, a.Digest(), c.Digest())
	assert.NotEqual(t, queue.NewCapabilities([]string{"ab", "c"}).Digest(), queue.NewCapabilities([]string{"a", "bc"}).Digest(),
		"item boundaries are part of the digest")

	assert.True(t, a.Meets("class:X"))
	assert.False(t, a.Meets("class:Y"))
	assert.True(t, a.Meets(queue.ValueNeed("X/ckpt", "a")))
	assert.False(t, a.Meets(queue.ValueNeed("X/ckpt", "b")), "listed key, value absent")
	assert.True(t, a.Meets(queue.ValueNeed("X/vae", "b")), "unlisted key: any value")
	assert.False(t, a.Meets("value:=b"), "a value need needs a key; else it is a plain need")
	assert.Equal(t, []string{"class:Y", "value:X/ckpt=b"}, a.Unmet([]string{"class:X", "class:Y", "value:X/ckpt=b"}))
	assert.True(t, a.MeetsAll(nil))

	var none *queue.Capabilities
	assert.True(t, none.MeetsAll([]string{"class:Anything"}), "nil: no filter")
	assert.Empty(t, none.Digest())
	assert.Zero(t, none.Len())
	assert.False(t, none.Has("class:X"))

	key, val, ok := queue.SplitValueNeed("value:K/in=a=b")
	assert.True(t, ok)
	assert.Equal(t, "K/in", key)
	assert.Equal(t, "a=b", val, "the value may contain '='")
	assert.Equal(t, "list:K/in", queue.ListCapability("K/in"))
}
