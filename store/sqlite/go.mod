module github.com/warden-go/warden/store/sqlite

go 1.25.0

require github.com/warden-go/warden v0.0.0

replace github.com/warden-go/warden => ../..
