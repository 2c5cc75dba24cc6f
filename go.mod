module github.com/warden-go/warden

go 1.26.0
