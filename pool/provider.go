package pool

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/comfypool/comfypool/comfy"
)

// Provider is how a backend's ComfyUI is reached: a server the Pool
// dials directly, or Comfy Cloud through its API. See BackendConfig.Provider.
type Provider string

// The providers.
const (
	// ProviderSelfHosted is a ComfyUI the Pool reaches directly (on the
	// network, or behind a proxy: see comfy.ClientOptions for its auth).
	ProviderSelfHosted Provider = "self_hosted"
	// ProviderCloud is Comfy Cloud (comfy.CloudURL), through its API with
	// an API key (comfy.ClientOptions.APIKey).
	ProviderCloud Provider = "cloud"
)

// ProviderTag returns the tag every backend has implicitly for its
// provider, besides its BackendConfig.Tags and BackendTag: "provider:"
// followed by the provider. A job whose EnqueueOpts.Tags include
// ProviderTag(ProviderCloud) runs only on Comfy Cloud backends, one with
// ProviderTag(ProviderSelfHosted) only on the others.
func ProviderTag(p Provider) string { return providerTagPrefix + string(p) }

const providerTagPrefix = "provider:"

// providerDefaults fills in a backend's provider: cloud when its client
// has a Comfy Cloud API key, else self-hosted; and a cloud backend's URL,
// comfy.CloudURL. A remote backend's provider is what its worker
// declares: the worker holds the key, the Pool neither URL nor client.
func (b *BackendConfig) providerDefaults() {
	if b.Provider == "" {
		b.Provider = ProviderSelfHosted
		if b.Client != nil && b.Client.APIKey != "" {
			b.Provider = ProviderCloud
		}
	}
	if b.Provider == ProviderCloud && b.URL == "" && !b.remote {
		b.URL = comfy.CloudURL
	}
}

// validateProvider reports what is wrong with the provider of Backends[i]
// (defaults applied): an unknown provider, a cloud backend without an API
// key, a Cloud API key on a self-hosted backend, a tag with the reserved
// prefix.
func (b *BackendConfig) validateProvider(i int) error {
	hasKey := b.Client != nil && b.Client.APIKey != ""
	switch {
	case b.Provider != ProviderSelfHosted && b.Provider != ProviderCloud:
		return fmt.Errorf("pool: Backends[%d].Provider %q must be %q or %q", i, b.Provider, ProviderSelfHosted, ProviderCloud)
	case slices.ContainsFunc(b.Tags, func(t string) bool { return strings.HasPrefix(t, providerTagPrefix) }):
		return fmt.Errorf("pool: Backends[%d].Tags cannot use the reserved prefix %q (see ProviderTag)", i, providerTagPrefix)
	case b.remote: // its worker reaches its ComfyUI: no client here to check
	case b.Provider == ProviderCloud && !hasKey:
		return fmt.Errorf("pool: Backends[%d].Provider %q requires Client.APIKey (a Comfy Cloud API key)", i, ProviderCloud)
	case b.Provider == ProviderSelfHosted && hasKey:
		return fmt.Errorf("pool: Backends[%d].Client.APIKey is a Comfy Cloud API key: Provider must be %q (or empty)", i, ProviderCloud)
	}
	return nil
}

// probeBackend is Start's check that a backend accepts the Pool's
// requests: GET /system_stats, or for Comfy Cloud, where that route is
// public, GET /api/prompt, which needs the API key.
func probeBackend(ctx context.Context, b *backend) error {
	if b.cfg.Provider == ProviderCloud {
		_, err := b.client.QueueRemaining(ctx)
		return err
	}
	_, err := b.client.SystemStats(ctx)
	return err
}
