package idemecho

import _ "github.com/labstack/echo/v4"
