module github.com/warden-go/warden/examples

go 1.26.0

require (
	github.com/warden-go/warden v0.0.0
	github.com/warden-go/warden/store/sqlite v0.0.0
)

replace (
	github.com/warden-go/warden => ../
	github.com/warden-go/warden/store/sqlite => ../store/sqlite
)
