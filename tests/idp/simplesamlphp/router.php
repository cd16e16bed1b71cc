<?php
/*
 * Router for PHP's built-in web server (`php -S HOST:PORT -t /usr/share/simplesamlphp/www router.php`).
 *
 * The built-in server passes its process environment to scripts (getenv()), so SimpleSAMLphp finds
 * SIMPLESAMLPHP_CONFIG_DIR by itself; this router only refuses to start without it (rather than
 * silently using Debian's /etc/simplesamlphp) and then lets the server handle the request as usual,
 * including PATH_INFO URLs such as /module.php/core/loginuserpass.php.
 */

if (getenv('SIMPLESAMLPHP_CONFIG_DIR') === false) {
    http_response_code(500);
    header('Content-Type: text/plain');
    echo "SIMPLESAMLPHP_CONFIG_DIR is not set\n";
    return true;
}

return false;
