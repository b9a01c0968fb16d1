module github.com/comfypool/comfypool/cmd/comfypool

go 1.25.0

replace (
	github.com/comfypool/comfypool => ../..
	github.com/comfypool/comfypool/queue/pgqueue => ../../queue/pgqueue
	github.com/comfypool/comfypool/queue/redisqueue => ../../queue/redisqueue
)

require (
	github.com/comfypool/comfypool v0.0.0-00010101000000-000000000000
	github.com/comfypool/comfypool/queue/pgqueue v0.0.0-00010101000000-000000000000
	github.com/comfypool/comfypool/queue/redisqueue v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/stretchr/testify v1.11.1
	github.com/vbauerster/mpb/v8 v8.15.2
)

require (
	github.com/VividCortex/ewma v1.2.0 // indirect
	github.com/acarl005/stripansi v0.0.0-20180116102854-5a71ef0e047d // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/clipperhouse/uax29/v2 v2.7.0 // indirect
	github.com/coder/websocket v1.8.15 // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/expr-lang/expr v1.17.8 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mattn/go-runewidth v0.0.27 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/vbauerster/cupwriter v0.0.4 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
